"""``python -m swapkl tasks MODEL --budget N --tasks a,b``: task accuracy after removal, through lm-evaluation-harness
itself -- the base model and each method's pruned model at n = 1..N, evaluated in memory (docs/tasks.md)."""
from __future__ import annotations

import sys

from swapkl.commands.common import (add_selection_args, selection_fields, block_unit_only, add_bridge_args, add_contract_args, add_model_args, check_outputs,
                                    add_task_args, check_task_numbers, contract_from_args, emit, load_from_args,
                                    removal_plan, task_settings_of)
from swapkl.commands.curves import load_scores
from swapkl.errors import SwapklError
from swapkl.measure import lmeval
from swapkl.removal import methods as M
from swapkl.removal.plan import RunHooks


def register(sub) -> None:
    p = sub.add_parser("tasks", help="lm-eval task accuracy of each method's pruned model at n = 1..N")
    add_model_args(p)
    p.add_argument("--budget", type=int, required=True, help="largest number of removed layers N (n = 1..N)")
    p.add_argument("--methods", default=",".join(M.default_set("tasks")),
                   help="comma-separated removal methods, as for 'curves' (default: %(default)s)")
    add_task_args(p)
    p.add_argument("--scores", default=None, metavar="SCORES.json",
                   help="a 'swapkl score --json' file (default: compute the scores with the engine and its cache)")
    p.add_argument("--spacing", type=int, default=1, help="Δ: never remove two layers within Δ slots (default 1)")
    add_selection_args(p)
    p.add_argument("--seeds", type=int, default=M.DEFAULT_RUNS, help="random baseline seeds (>= 5)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the result JSON here")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--calib-tokens", type=int, default=None,
                   help="calibration tokens of every method that reads calibration text and, with --repair bridge, "
                        "of the bridge (default: each one's own)")
    add_contract_args(p)
    add_bridge_args(p)
    p.set_defaults(func=run)


def _check_args(a):
    """Every check that needs neither lm-eval's task index nor the model: (plan, task names)."""
    check_task_numbers(a)
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    if not methods:
        raise SwapklError("--methods names no method")
    # unknown methods, a bad budget or spacing and bad repair flags fail here
    plan = removal_plan(a, methods, **selection_fields(a),
                        seeds=tuple(range(a.seeds)), calib_tokens=a.calib_tokens)
    tasks = lmeval.parse_task_names(a.tasks)
    check_outputs(a, {"--json": a.json}, inputs=[a.scores])
    return plan, tasks


def run(a) -> int:
    block_unit_only(a, "tasks")  # sublayer removal is not done here yet: refused before any work
    plan, tasks = _check_args(a)
    include = lmeval.check_include_path(a.include_path) if a.include_path else None
    loaded = load_scores(a.scores) if a.scores else None  # a bad file fails before the model is loaded
    if loaded is not None and (loaded[2] or {}).get("unit", "block") != "block":  # this command removes blocks
        raise SwapklError(f"the scores file {a.scores} holds {loaded[2]['unit']} swap-KL; 'tasks' works on whole "
                          "blocks only (score with --unit block)")
    with lmeval.preloaded(include, tasks):  # unknown or unloadable tasks fail before the model is loaded
        return _run(a, plan, tasks, include, loaded)


def _run(a, plan, tasks, include, loaded) -> int:
    ck = load_from_args(a)
    from swapkl.removal.tasks import task_accuracy  # deferred: torch-based helpers (--help)

    # the plan against the model before the scores are computed (placeholder matrices stand for the scores to come)
    import numpy as np

    plan.check(ck.num_layers, {k: np.zeros((ck.num_layers,) * 2) for k in ("replacement", "interchange")})
    checked = check_task_regions(a, ck, include, tasks)  # a task built from text the run reads: refused here
    scores, src = _scores(a, ck, loaded)

    def prog(done, total, msg):
        if not a.quiet:
            print(f"  [{done}/{total}] {msg}", file=sys.stderr, flush=True)

    settings = task_settings_of(a, tasks, include)
    contract = contract_from_args(a)  # the prompts a bridge's text avoids and a bridge-guided method scores on
    result = task_accuracy(ck.model, ck.tokenizer, scores, plan, settings,
                           RunHooks(progress=prog, identity=ck.identity, contract=contract))
    if src:
        result.notes.insert(0, src)
    result.notes.extend(checked)
    return emit(a, result, render)


def check_task_regions(a, ck, include, tasks) -> list[str]:
    """Every task's documents against the text this run reads from its corpus (:mod:`swapkl.measure.task_regions`):
    the scoring prompts, the calibration text of the methods that read it, and with ``--repair bridge`` the whole
    prompt region (the bridge's calibration windows lie anywhere in it); no held-out perplexity is read here.
    Raises the one-line :class:`~swapkl.measure.task_regions.TaskOverlapError`; returns one note per task."""
    from swapkl.measure import task_regions as TR

    _tm, loaded = lmeval.load_tasks(include, tasks)
    return TR.check_contract(loaded, contract_from_args(a), ck.tokenizer,
                             whole_prompt_region=getattr(a, "repair", "none") == "bridge")


def _scores(a, ck, loaded) -> tuple[dict, str | None]:
    """The swap-KL scores (the guided methods need them; recommend and laco use them when given, as in 'curves')."""
    if loaded is not None:
        from swapkl.removal.checks import check_scores

        scores, ident, _ = loaded
        check_scores(scores, ck.num_layers, ident, ck.identity)
        return scores, f"scores from {a.scores}"
    from swapkl.scoring.score import score  # deferred: pulls torch; the CLI's --help must not

    contract = contract_from_args(a)
    res = score(ck, contract, use_cache=not a.no_cache)
    return (res.protocol_scores(),
            f"scores computed (pairs={contract.pairs}, prompts={contract.prompts}x{contract.tokens})")


def _fmt(v, e) -> str:
    if v is None:
        return "-"
    return f"{v:.4f} ± {e:.4f}" if e is not None else f"{v:.4f}"


def render(r) -> str:
    c = r.contract
    m = r.model
    lines = [f"model: {m.get('display') or m.get('id') or m.get('name_or_path')}  layers: {m.get('num_layers')}",
             f"lm-eval {c['lm_eval_version']} ({c['evaluator']}); limit {c['limit'] or 'all'}, few-shot "
             f"{c['num_fewshot'] if c['num_fewshot'] is not None else 'task default'}, batch {c['batch_size']}"]
    for task, info in c["tasks"].items():
        ch = f", chance {info['chance']:.4f}" if info.get("chance") is not None else ""
        lines.append(f"task {task}: version {info['versions'].get(task, info['versions'])}{ch}")
    for task, metrics in r.base.get("metrics", {}).items():
        for metric, v in metrics.items():
            lines.append(f"{task} {metric}")
            lines.append(f"  base{'':<22} {_fmt(v, r.base['stderr'][task].get(metric))}")
            for name, entries in r.methods.items():
                for e in entries:
                    rem = e["removed"] if e["removed"] is not None else f"mean of {e.get('n_seeds')} seeds"
                    val = e["metrics"].get(task, {}).get(metric)
                    err = e["stderr"].get(task, {}).get(metric)
                    lines.append(f"  {name:<12} n={e['n']:<3} {str(rem):<14} {_fmt(val, err)}")
            for name, entries in (r.repaired or {}).items():  # --repair bridge: the bridged model beside the raw
                for e in entries:
                    val = e["metrics"].get(task, {}).get(metric)
                    lines.append(f"  {name + '+bridge':<12} n={e['n']:<3} {str(e['removed']):<14} "
                                 f"{_fmt(val, e['stderr'].get(task, {}).get(metric))}")
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
