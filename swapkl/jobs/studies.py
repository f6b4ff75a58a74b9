"""The Study page's backend (no Streamlit): the request (:class:`StudyRequest`, one
:class:`~swapkl.study.plan.StudyPlan`), the form that builds it (:func:`study_request`), the pipeline that runs it
through the job system (:func:`run_study_job`: the same :func:`swapkl.study.run.run_study` as ``swapkl study``,
with the study cache, so a page's study and the command's share finished rows), the shared link of a study
(:func:`study_query`, :func:`query_form`) and the link from a row to that model's own analysis
(:func:`analysis_link`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlencode

from swapkl.contract import Contract
from swapkl.errors import SwapklError
from swapkl.study.plan import StudyModel, StudyPlan

#: the page's introduction
INTRO = ("The same analysis on every model of a list, under one contract: regime and protocol gap, removal cost of "
         "replacement- and interchange-guided sets (I/R with paired CIs), which signal predicts removal cost. Each "
         "finished model is cached: a study resumes where it stopped, and shares its rows with `swapkl study`.")
#: the page's evaluator: the matched evaluator's windows on the first ``max_words`` words (labelled so)
WINDOW, STRIDE = 512, 256


@dataclass(frozen=True)
class StudyRequest:
    """A study as a job: ``plan`` (models and contract).  ``kind`` ``"study"``."""

    plan: StudyPlan = field(default_factory=StudyPlan)
    kind: str = "study"
    contract: Contract = field(init=False, compare=False)  # the plan's (what the policy bounds)
    budget: int = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "contract", self.plan.contract)
        object.__setattr__(self, "budget", self.plan.budget)

    def to_dict(self) -> dict:
        return {"kind": self.kind, **self.plan.to_dict(), "contract_key": self.plan.key()}

    def label(self) -> str:
        c = self.plan.contract
        return (f"study of {len(self.plan.models)} model(s): {', '.join(m.label for m in self.plan.models)} · pairs "
                f"{c.pairs} · {c.prompts}×{c.tokens} · budget {self.plan.budget} · evaluator "
                f"{self.plan.evaluator.get('name')}")


def model_lines(text: str) -> list[StudyModel]:
    """The models of the page's text box: one per line, ``spec[@revision] [label...]`` (``#`` starts a comment)."""
    out = []
    for line in str(text or "").splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        spec, _, label = line.partition(" ")
        m = StudyModel.from_any(spec)
        out.append(StudyModel(m.spec, m.revision, label.strip() or None))
    if not out:
        raise SwapklError("give at least one model (one spec a line)")
    return out


def study_request(text: str, contract: Contract, budget: int, max_words: int, n_boot: int, seeds: int = 5,
                  evidence: bool = True, eval_text: str | None = None) -> StudyRequest:
    """The request of the page's form: the models of ``text`` (:func:`model_lines`), ``contract``, n = 1..budget,
    the matched evaluator's windows over the first ``max_words`` words (labelled ``matched@Nw``), ``n_boot``
    resamples; everything checked here (one line)."""
    if max_words < 1:
        raise SwapklError(f"max words must be positive (got {max_words})")
    ev = {"name": f"matched@{int(max_words)}w", "max_words": int(max_words), "window": WINDOW, "stride": STRIDE,
          "drop_first_target": False}
    plan = StudyPlan(contract=contract, evaluator=ev, eval_text=eval_text, budget=int(budget), seeds=int(seeds),
                     n_boot=int(n_boot), evidence=bool(evidence), models=tuple(model_lines(text)))
    return StudyRequest(plan)


def study_query(req: StudyRequest) -> dict[str, str]:
    """The query string of a shared link to the study: its models (one per ``;``, ``spec@rev label``) and the
    settings the form has."""
    p, c = req.plan, req.plan.contract
    models = ";".join(f"{m.name} {m.label}" if m.label != m.name else m.name for m in p.models)
    return {"models": models, "budget": str(p.budget), "max_words": str(p.evaluator.get("max_words")),
            "n_boot": str(p.n_boot), "prompts": str(c.prompts), "tokens": str(c.tokens), "pairs": c.pairs,
            "evidence": "1" if p.evidence else "0"}


def query_form(query) -> dict:
    """The form's values a shared link carries (:func:`study_query`), typed; values that do not convert are left
    out (the form's defaults stay)."""
    out = {}
    if "models" in query:
        out["models"] = "\n".join(x.strip() for x in str(query["models"]).split(";") if x.strip())
    for k in ("budget", "max_words", "n_boot", "prompts", "tokens"):
        try:
            out[k] = int(query[k])
        except (KeyError, ValueError, TypeError):
            pass
    if "pairs" in query:
        out["pairs"] = str(query["pairs"])
    if "evidence" in query:
        out["evidence"] = str(query["evidence"]) != "0"
    return out


def analysis_link(req: StudyRequest, model: dict) -> str:
    """The Start page's shared link (``/?...``) to ``model``'s own analysis under the study's contract: the same
    scores, budget, evaluator and methods (:func:`swapkl.jobs.forms.query_params`)."""
    from swapkl.jobs.forms import query_params
    from swapkl.jobs.requests import AnalysisRequest

    p = req.plan
    a = AnalysisRequest(model=model["spec"], revision=model.get("revision"), contract=p.contract, budget=p.budget,
                        methods=p.methods, evaluator=dict(p.evaluator))
    return "/?" + urlencode(query_params(a))


def finished(manager, request: StudyRequest) -> bool:
    """Whether ``manager`` holds a finished snapshot of ``request`` (a study opened by link is then shown at once,
    its submission served from the snapshot without computing)."""
    from swapkl.jobs.requests import request_key

    try:
        return manager.use_snapshots and (manager.snapshots.root / request_key(request) / "snapshot.json").is_file()
    except SwapklError:
        return False


def run_study_job(job, models) -> None:
    """A study job: :func:`swapkl.study.run.run_study` on the request's plan, one model after the other through the
    server's model cache (emptied after each model: one model in memory), the partial study published after every
    model (``job.study``) and each model's steps as the job's progress."""
    from swapkl.measure.evaluate import Evaluator
    from swapkl.scoring.corpora import load_corpus
    from swapkl.study.run import run_study

    plan: StudyPlan = job.request.plan
    for m in plan.models:  # the study reads each model's files (its cache key) before loading it: the gate first
        models.check(m.spec, m.revision)
    corpus = load_corpus(plan.eval_text) if plan.eval_text else load_corpus(plan.contract.corpus)

    def load(m):
        models.clear()
        ck = models.get(m.spec, m.revision, plan.contract.dtype, plan.contract.device)
        job.checkpoint = ck
        return ck

    def progress(k, n, label, done, total, what):
        job.phase(k, n, f"model {k}/{n} {label}: {what}")
        job.tick(done, total, what)

    def publish(partial):
        job.study = partial
        job.checkpoint = None

    job.study = run_study(plan, Evaluator.from_dict(plan.evaluator), corpus, load, progress=progress,
                          on_row=publish, should_stop=job.should_stop)
    models.clear()
