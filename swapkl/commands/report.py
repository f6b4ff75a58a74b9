"""``python -m swapkl report MODEL ... --out report.html``: one self-contained HTML report.

From files (no model computation): ``--scores SCORES.json`` (``swapkl score --json``), ``--curves CURVES.json``
(``swapkl curves --json``), ``--trajectory TRAJ.json`` (a trajectory JSON), ``--tasks TASKS.json`` (``swapkl tasks
--json``: the task accuracy section).  Otherwise the scores are computed
through :func:`swapkl.scoring.score.score` (cached) under the contract arguments, and with ``--budget N`` the removal curves
through :func:`swapkl.removal.curves.removal_curves`.  MODEL may be omitted when files provide everything.
"""
from __future__ import annotations

import sys

from swapkl.scoring import corpora
from swapkl.removal import methods as M
from swapkl.views import report
from swapkl.views import tasks as task_views
from swapkl.commands.common import block_unit_only, ProgressPrinter, add_contract_args, add_model_args, check_outputs, \
    contract_from_args, load_from_args, removal_plan
from swapkl.errors import SwapklError
from swapkl.removal import curves as C
from swapkl.removal.checks import check_evaluator_context, check_same_model, check_scores

def register(sub) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report (scores, verdict, curves, trajectory)")
    add_model_args(p)
    for act in p._actions:  # MODEL is optional when --scores/--curves/--trajectory provide the data
        if act.dest == "model":
            act.nargs = "?"
            act.default = None
    add_contract_args(p)
    p.add_argument("--scores", default=None, metavar="SCORES.json",
                   help="a 'swapkl score --json' file (default: compute the scores with the engine and its cache)")
    p.add_argument("--curves", default=None, metavar="CURVES.json", help="a 'swapkl curves --json' file")
    p.add_argument("--trajectory", default=None, metavar="TRAJ.json", help="a trajectory JSON file")
    p.add_argument("--heal", default=None, metavar="HEAL.json",
                   help="healed curves (experiments/heal.py --json, the dashboard's download) or a 'swapkl heal --json' "
                        "result: adds the healing section")
    p.add_argument("--evidence", default=None, metavar="EV.json", help="a 'swapkl evidence --json' file")
    p.add_argument("--tasks", default=None, metavar="TASKS.json",
                   help="a 'swapkl tasks --json' file: adds the task accuracy after removal")
    p.add_argument("--budget", type=int, default=None,
                   help="also compute removal curves for n = 1..N (needs MODEL; ignored with --curves)")
    p.add_argument("--methods", default=",".join(M.default_set("dashboard")),
                   help="removal methods for --budget, comma-separated (default: %(default)s)")
    p.add_argument("--evaluator", default="matched", choices=["matched", "standard"],
                   help="perplexity evaluator for --budget (matched: 5,000 words, 512/256; standard: 20,000, "
                        "1024/512)")
    p.add_argument("--eval-text", default=None, metavar="PATH", help="text file for perplexity (default: WikiText-2)")
    p.add_argument("--spacing", type=int, default=1, help="Δ: never remove two layers within Δ slots (default 1)")
    p.add_argument("--seeds", type=int, default=M.DEFAULT_RUNS, help="random baseline seeds")
    p.add_argument("--title", default=None, help="report title")
    p.add_argument("--top", type=int, default=10, help="rows of the top-pairs table (default 10)")
    p.add_argument("--out", default="report.html", help="output HTML file (default: %(default)s)")
    p.add_argument("--html", action="store_true",
                   help="write HTML (the only format; accepted for 'swapkl report STUDY.json --html')")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def _say(a, msg: str) -> None:
    if not a.quiet:
        print(msg, file=sys.stderr, flush=True)


def run(a) -> int:
    if a.model and str(a.model).endswith(".json") and _is_study(a.model):
        return _study_report(a)
    block_unit_only(a, "report")  # sublayer removal is not done here yet: refused before any work
    if a.budget is not None and a.budget < 1:
        raise SwapklError(f"--budget must be at least 1 (got {a.budget})")
    want_curves = a.budget is not None and not a.curves
    contract = contract_from_args(a) if not a.scores else None  # validates the contract before loading
    if not a.model and (want_curves or not (a.scores or a.curves or a.trajectory or a.heal or a.evidence or a.tasks)):
        raise SwapklError("give MODEL (to compute) or --scores/--curves/--trajectory/--heal/--evidence/--tasks files "
                          "to report on")
    check_outputs(a, {"--out": a.out}, inputs=[a.scores, a.curves, a.trajectory, a.eval_text, a.heal, a.evidence,
                                               a.tasks])
    tasks = task_views.load_tasks(a.tasks, "--tasks file") if a.tasks else None
    result = report.as_result(a.scores) if a.scores else None
    curves = report.as_curves(a.curves) if a.curves else None
    traj = report.as_trajectory(a.trajectory) if a.trajectory else None
    sections = (_evidence_section(a, result) + ([heal_section(a.heal, result)] if a.heal else [])
                + ([task_views.section(tasks)] if tasks is not None else []))
    if result is not None and curves is not None:  # never one report from two models
        check_same_model(result, curves.get("model"), what=f"--scores {a.scores} and --curves {a.curves} are for "
                                                            "different models")

    ck = None
    if a.model and (want_curves or (result is None and curves is None and traj is None and not sections)):
        ck = load_from_args(a)
        if want_curves:  # the evaluator must fit the model before the scores are computed
            from swapkl.measure.evaluate import get_evaluator  # deferred: pulls torch; the CLI's --help must not

            check_evaluator_context(ck.model, get_evaluator(a.evaluator), name=ck.identity.get("display"))
    if result is None and ck is not None:
        from swapkl.scoring.score import score  # deferred: pulls torch; the CLI's --help must not

        _say(a, f"scoring {ck.identity.get('display')} (pairs={contract.pairs}, "
                f"{contract.prompts}x{contract.tokens} tokens)")
        result = score(ck, contract, progress=ProgressPrinter(a.quiet), use_cache=not a.no_cache)
    if want_curves:
        curves = _compute_curves(a, ck, result)
    if tasks is not None and (result is not None or curves is not None):  # never one report from two models
        check_scores({}, 0, result.identity if result is not None else curves.get("model"), tasks.model,
                     what=f"--tasks {a.tasks} is for another model than the scores or curves")
    html = report.build_report(result, curves, traj, title=a.title, out=a.out, top_k=a.top, sections=sections)
    _say(a, f"wrote {a.out} ({len(html) / 1e6:.1f} MB, {report.figure_count(html)} figures)")
    if result is not None and not a.quiet:
        v = report.report_verdict(result, curves)
        if v and "sentence" in v:
            print(v["sentence"])
    return 0


def _is_study(path: str) -> bool:
    """Whether MODEL is a study file (``swapkl study --json``): its first bytes carry the study format tag."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return '"swapkl.study/1"' in f.read(4096)
    except OSError:
        return False


def _study_report(a) -> int:
    """``swapkl report STUDY.json --html``: the study's self-contained report (grid, figures, statements)."""
    from swapkl.study.figures import section
    from swapkl.study.result import StudyResult

    path, a.model = a.model, None  # a file, not a model spec
    check_outputs(a, {"--out": a.out}, inputs=[path])
    study = StudyResult.from_json(path)
    html = report.build_report(title=a.title or f"swapkl study: {len(study.rows)} models", out=a.out,
                               sections=[section(study)])
    _say(a, f"wrote {a.out} ({len(html) / 1e6:.1f} MB, {report.figure_count(html)} figures)")
    return 0


def _evidence_section(a, result) -> list:
    """``--evidence``: the evidence section (swapkl.evidence.section), checked to be of the scores' model."""
    if not a.evidence:
        return []
    from swapkl.evidence.section import as_evidence, section

    d = as_evidence(a.evidence, f"--evidence {a.evidence}")
    if result is not None:
        check_same_model(result, (d.get("contract") or {}).get("model"),
                         what=f"--scores {a.scores} and --evidence {a.evidence} are for different models")
    return [section(d)]


def _compute_curves(a, ck, result):
    from swapkl.removal.plan import RunHooks

    if result is None:
        raise SwapklError("--budget needs swap-KL scores (give MODEL, or --scores)")
    scores = result.protocol_scores()
    check_scores(scores, ck.num_layers, result.identity, ck.identity)
    plan = removal_plan(a, [m.strip() for m in a.methods.split(",") if m.strip()], seeds=tuple(range(a.seeds)),
                        evaluator=a.evaluator)
    corpus = corpora.load_corpus(a.eval_text) if a.eval_text else corpora.load_corpus()

    def prog(done, total, msg):
        _say(a, f"  {msg}")

    return C.removal_curves(ck.model, ck.tokenizer, scores, plan, RunHooks(progress=prog, identity=ck.identity, corpus=corpus))


def heal_section(path, result=None):
    """The healing section of the report from ``--heal FILE`` (healed curves or one heal result), validated; refused
    when ``result`` (the report's scores) is for another model."""
    import json
    from pathlib import Path

    from swapkl.healing.curves import HealCurves
    from swapkl.healing.figures import section

    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SwapklError(f"--heal {path}: cannot read it as JSON ({type(e).__name__})") from None
    try:
        hc = HealCurves.from_dict(d, f"--heal {path}")
        if result is not None:
            check_same_model(result, hc.contract.get("model"),
                             what=f"--scores and --heal {path} are for different models")
        return section(hc)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise SwapklError(f"--heal {path}: not healed curves nor a heal result ({type(e).__name__}: {e})") from None
