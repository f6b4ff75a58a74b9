"""``python -m swapkl study MODEL... --json OUT``: the same analysis of every model of a list under one contract
(regime and protocol gap, removal ΔPPL and I/R with paired CIs, which signal predicts removal cost, the run's cost),
one model in memory at a time, each finished model cached (a study resumes where it stopped); the table across
models and its statements.  ``--shard K/N`` runs one share; ``--merge SHARE.json...`` joins the shares."""
from __future__ import annotations

import sys

from swapkl.commands.common import add_contract_args, add_task_args, check_outputs, check_task_numbers, contract_from_args, emit, evaluator_and_corpus
from swapkl.errors import SwapklError
from swapkl.removal import methods as M
from swapkl.study import plan as P


def register(sub) -> None:
    p = sub.add_parser("study", help="one analysis over a list of models: the paper's table, cached and resumable")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="model specs (hub id[@revision], folder, .gguf, 'default'), or one .yaml/.toml/.txt list "
                        "of models (spec, revision, label)")
    p.add_argument("--models", dest="model_list", default=None, metavar="LIST",
                   help="a YAML / TOML list of models ({spec, revision, label}), or a text file of one spec a line")
    p.add_argument("--budget", type=int, default=3, help="removal curves for n = 1..N (default %(default)s)")
    p.add_argument("--methods", default=",".join(M.default_set("study")),
                   help="removal methods; replacement and interchange always run (default %(default)s)")
    p.add_argument("--seeds", type=int, default=5, help="random-baseline seeds (default %(default)s)")
    p.add_argument("--evaluator", default="matched", choices=["matched", "standard"])
    p.add_argument("--max-words", type=int, default=P.DEFAULT_HELDOUT_WORDS,
                   help="held-out words (default %(default)s: docs/study.md, 'How much held-out text'; labelled)")
    p.add_argument("--eval-text", default=None, metavar="PATH", help="text file for held-out perplexity")
    p.add_argument("--repair", default="none", choices=["none", "bridge"],
                   help="bridge: the predictor validity also after each block's linear bridge")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of every CI (default 1000)")
    p.add_argument("--signals", default=",".join(P.DEFAULT_SIGNALS),
                   help="evidence signals besides both protocols (default %(default)s)")
    p.add_argument("--no-evidence", action="store_true", help="skip the predictor validity (single-block costs)")
    tasks = p.add_argument_group("task accuracy (optional; the flags of 'swapkl tasks')")
    add_task_args(tasks, required=False, batch=False)
    p.add_argument("--shard", default=None, metavar="K/N", help="run share K of N of the models (1-based)")
    p.add_argument("--merge", nargs="+", default=None, metavar="SHARE.json",
                   help="join 'study --shard' outputs into one study (refused when their contracts differ)")
    loading = p.add_argument_group("loading and output")
    for flags, kw in ((("--dtype",), {"default": "float32", "choices": ["float32", "bfloat16", "float16"]}),
                      (("--device",), {"default": "auto", "help": "auto | cpu | cuda | cuda:N"}),
                      (("--trust-remote-code",), {"action": "store_true", "help": "run code shipped with the models"}),
                      (("--json",), {"default": None, "metavar": "OUT", "help": "write the study JSON here"}),
                      (("--quiet",), {"action": "store_true"})):
        loading.add_argument(*flags, **kw)
    add_contract_args(p)
    for act in p._actions:  # --preset also names a ready model list (the paper's)
        if act.dest == "preset":
            act.choices = sorted([*act.choices, "paper"])
            act.help += "; paper: the paper's models at the paper's contract (needs the hub and a GPU)"
    p.set_defaults(func=run)


def build_plan(a) -> P.StudyPlan:
    """The :class:`~swapkl.study.plan.StudyPlan` of the flags (``--preset paper``: its models and contract under
    any flag given explicitly); everything checked before a model is loaded."""
    from swapkl.study.presets import PAPER_CONTRACT, preset_models

    models = []
    for m in a.models:
        models += P.read_model_list(m) if m.endswith((".yaml", ".yml", ".toml", ".txt")) else [P.StudyModel.from_any(m)]
    if a.model_list:
        models += P.read_model_list(a.model_list)
    paper = a.preset == "paper"
    if paper:
        a.preset = "canonical"
        models = models or preset_models("paper")
        for k, v in PAPER_CONTRACT["scoring"].items():
            if getattr(a, k, None) == _default(a, k):
                setattr(a, k, v)
        a.budget = PAPER_CONTRACT["budget"] if a.budget == 3 else a.budget  # n = 1, 3, 5: the paper's
        if a.max_words == P.DEFAULT_HELDOUT_WORDS:  # the paper's matched evaluator, unshortened
            a.max_words = None
    if not models:
        raise SwapklError("give the models to study (MODEL..., --models LIST or --preset paper)")
    ev, _ = evaluator_and_corpus(a)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    return P.StudyPlan(contract=contract_from_args(a), evaluator=ev.to_dict(), eval_text=a.eval_text,
                       budget=a.budget, methods=tuple(methods), seeds=a.seeds, repair=a.repair, n_boot=a.n_boot,
                       signals=tuple(s.strip() for s in a.signals.split(",") if s.strip()),
                       evidence=not a.no_evidence, tasks=_tasks(a), models=tuple(models))


def _tasks(a) -> dict | None:
    """The plan's task settings of ``--tasks`` and its flags (refused without ``--tasks``), checked here."""
    from swapkl.measure import lmeval

    if not a.tasks:
        if a.include_path or a.limit is not None or a.num_fewshot is not None:
            raise SwapklError("--include-path, --limit and --num-fewshot go with --tasks")
        return None
    check_task_numbers(a)
    ip = lmeval.check_include_path(a.include_path) if a.include_path else None
    return {"tasks": lmeval.parse_task_names(a.tasks), "include_path": ip, "limit": a.limit,
            "num_fewshot": a.num_fewshot}


def _default(a, name):
    return {"pairs": "adjacent", "prompts": 16, "tokens": 64, "positions": None, "dtype": "float32"}.get(name)


def run(a) -> int:
    from swapkl.study.result import StudyResult, merge

    check_outputs(a, {"--json": a.json}, inputs=[a.eval_text, *(a.merge or [])])
    if a.merge:
        if a.models or a.model_list or a.shard:
            raise SwapklError("--merge joins study files: give no MODEL, --models or --shard with it")
        shares = [StudyResult.from_json(f) for f in a.merge]
        return emit(a, merge(shares, list(a.merge)), render)
    plan = build_plan(a)
    shard = P.parse_shard(a.shard)
    if shard and shard[1] > len(plan.models):
        raise SwapklError(f"--shard {a.shard}: the study has {len(plan.models)} model(s), fewer than {shard[1]} shares")
    _, corpus = evaluator_and_corpus(a)
    from swapkl.measure.evaluate import Evaluator
    from swapkl.study.run import run_study

    def load(m):
        from swapkl.model.checkpoints import load_checkpoint

        return load_checkpoint(m.spec, revision=m.revision, dtype=plan.contract.dtype, device=a.device,
                               trust_remote_code=a.trust_remote_code)

    def prog(k, n, label, done, total, what):
        if not a.quiet:
            print(f"  [{k}/{n}] {label}: {what}", file=sys.stderr, flush=True)

    with _tasks_loaded(plan.tasks):  # an unknown or unloadable task fails here, before any model loads
        if plan.tasks:  # and a task built from the held-out or calibration text
            from swapkl.study.tasks import check_disjoint

            check_disjoint(plan, Evaluator.from_dict(plan.evaluator), corpus)
        result = run_study(plan, Evaluator.from_dict(plan.evaluator), corpus, load, progress=prog, shard=shard)
    return emit(a, result, render)


def _tasks_loaded(tasks: dict | None):
    """The plan's lm-eval tasks loaded once for the run (:func:`swapkl.measure.lmeval.preloaded`), or nothing."""
    from contextlib import nullcontext

    from swapkl.measure import lmeval

    return lmeval.preloaded(tasks["include_path"], tasks["tasks"]) if tasks else nullcontext()


def render(r) -> str:
    from swapkl.study.across import rank_agreement, statements, table_rows
    from swapkl.study.presets import against_paper
    from swapkl.views.captions import contract_caption

    rows = table_rows(r)
    cols = list(dict.fromkeys(k for row in rows for k in row if k != "spec"))
    lines = [contract_caption(r.provenance())]
    lines.append(" | ".join(cols))
    for row in rows:
        lines.append(" | ".join(str(row.get(c, "")) for c in cols))
    lines += [f"- {s}" for s in statements(r)]
    for ag in rank_agreement(r):
        lines.append(f"rank agreement {ag['a']} vs {ag['b']} ({ag['layers']} layers, adjacent-pair scores): "
                     + "; ".join(f"{p} ρ {_num(ag[p]['rho'])}{_pair(ag[p]['ci'])}" for p in ("replacement",
                                                                                             "interchange")))
    for x in against_paper(r):
        lines.append(f"paper vs here: {x['label']} {x['measure']}" + (f" n={x['n']}" if x["n"] else "")
                     + f": paper {x['paper']}, here {_num(x['here'])}{_pair(x['here_ci'])}")
    lines += [f"note: {n}" for n in r.notes]
    if r.shard:
        lines.append(f"share {r.shard[0]} of {r.shard[1]}: join the shares with 'swapkl study --merge'")
    return "\n".join(lines)


def _num(v) -> str:
    from swapkl.views.captions import fmt_number

    return v if isinstance(v, str) else fmt_number(v, 3)


def _pair(ci) -> str:
    from swapkl.views.captions import fmt_ci

    return fmt_ci(*ci) if ci else ""
