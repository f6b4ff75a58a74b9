"""Task accuracy in a study (docs/study.md, "Task accuracy"): per model, lm-eval accuracy of every guided method's
sets at n = 1..budget (the sets the curves chose: the sets ``swapkl tasks`` chooses under the same selection rule)
and of every single evaluated block, through the task runner of ``swapkl tasks``
(:class:`~swapkl.measure.task_runner.TaskRunner`: its disk cache, prefix sharing and numbers), then

* ΔAcc of each set against the base with a paired per-document bootstrap CI (:func:`swapkl.measure.task_docs.delta`);
* I vs R per n: acc(I) − acc(R) on the same documents (:func:`swapkl.stats.mean_diff`; ``better``: interchange-guided
  removal loses less accuracy);
* the consensus cells (docs/consensus.md, "The comparison it must win") on ΔAcc;
* per protocol, the Spearman ρ of its layer score with the single-block accuracy loss, with a CI over document
  resamples, and the paired ρ-difference CI that picks the better predictor."""
from __future__ import annotations

import numpy as np

from swapkl.measure.task_docs import accuracy_key, delta, paired
from swapkl.stats import BOOT_SEED, bootstrap_indices, finite_ci, mean_diff, side, spearman, spearman_rows, tie

#: the guided methods a study evaluates on tasks
TASK_METHODS = ("replacement", "interchange", "consensus-mean", "consensus-max")
CONSENSUS = ("consensus-mean", "consensus-max")


def settings_of(spec: dict):
    """The :class:`~swapkl.measure.task_runner.TaskSettings` of a plan's ``tasks`` entry (the flags of ``swapkl
    tasks``: tasks, include path, limit, few-shot count, batch size)."""
    from swapkl.measure.task_runner import TaskSettings

    return TaskSettings(tuple(spec["tasks"]), include_path=spec.get("include_path"), limit=spec.get("limit"),
                        num_fewshot=spec.get("num_fewshot"), batch_size=spec.get("batch_size") or 16)


def _word(ci) -> str:
    """``better`` when acc(b) − acc(a) lies above 0, ``worse`` below, else ``tie``."""
    return side(ci, below="worse", above="better")


def _scores(a_docs, b_docs, task):
    return paired(a_docs, b_docs, task, accuracy_key(a_docs.get(task) or {}))


def consensus_cells(docs: dict, n: int, task: str, n_boot: int) -> dict:
    """Per consensus method at ``n``: acc(consensus) − acc(better of R and I) and − acc(worse) on the same documents
    (better: the higher accuracy point estimate), and whether R and I differ significantly."""
    r, i = docs["replacement"].get(n), docs["interchange"].get(n)
    if r is None or i is None:
        return {}
    sr, si = _scores(r, i, task)
    ri = mean_diff(sr, si, n_boot)
    better, worse = (si, sr) if np.mean(si) >= np.mean(sr) else (sr, si)
    out = {}
    for c in CONSENSUS:
        if docs.get(c, {}).get(n) is None:
            continue
        _, sc = _scores(r, docs[c][n], task)
        vb, vw = mean_diff(better, sc, n_boot), mean_diff(worse, sc, n_boot)
        out[c] = {"vs_better": vb["delta"], "vs_better_ci": vb["ci"], "vs_worse": vw["delta"],
                  "vs_worse_ci": vw["ci"], "worse_than_better": _word(vb["ci"]) == "worse",
                  "r_i_differ": _word(ri["ci"]) != "tie", "cheaper_than_worse": _word(vw["ci"]) == "better"}
    return out


def _rho(scores: np.ndarray, blocks: list, base: dict, singles: dict, task: str, n_boot: int) -> dict:
    """Spearman ρ of each protocol's layer score with the single-block accuracy loss, CIs over document resamples
    (one draw for every block and both protocols), and the paired ρ-difference (R − I) that picks a winner."""
    loss = np.array([[a - b for a, b in zip(*_scores(base, singles[k], task))] for k in blocks], float)  # (K, D)
    idx = bootstrap_indices(loss.shape[1], n_boot, BOOT_SEED)
    draws = loss[:, idx].mean(axis=2).T  # (B, K): each block's accuracy loss per resample
    point = loss.mean(axis=1)
    out, reps = {}, {}
    for p, s in scores.items():
        sv = np.asarray([s[k] for k in blocks], float)
        reps[p] = spearman_rows(np.broadcast_to(sv, draws.shape).copy(), draws)
        out[p] = {"rho": spearman(sv, point), "ci": finite_ci(reps[p])}
    diff = finite_ci(reps["replacement"] - reps["interchange"])
    winner = None if tie(diff) else ("replacement" if diff[0] > 0 else "interchange")
    out["pick"] = {"winner": winner, "by": "paired", "diff_ci": diff}
    return out


def check_disjoint(plan, ev, corpus, ck=None) -> list[str]:
    """Every task's documents against the text a row reads (:mod:`swapkl.measure.task_regions`): the calibration
    reserve of the scoring corpus and the evaluator's held-out words of ``corpus`` (held-out) -- the same for every
    model, checked before the first loads -- and with a loaded checkpoint ``ck`` its scoring prompts as well (they
    depend on its tokenizer).  Raises the one-line :class:`~swapkl.measure.task_regions.TaskOverlapError`;
    returns one note per task and corpus checked."""
    from swapkl.measure import lmeval
    from swapkl.measure import task_regions as TR

    st = settings_of(plan.tasks)
    _tm, loaded = lmeval.load_tasks(lmeval.check_include_path(st.include_path) if st.include_path else None, st.tasks)
    return TR.check_contract(loaded, plan.contract, ck.tokenizer if ck is not None else None, heldout=corpus,
                             heldout_words=int(ev.max_words))


def task_part(ck, plan, curves, scores: dict, should_stop=None) -> dict:
    """The row's ``tasks`` part for loaded checkpoint ``ck`` (see the module docstring): ``{"contract", "base",
    "methods": {m: [{"n", "removed", "metrics", "delta": {task: {...}}}]}, "i_vs_r": [{"n", task: {...}}],
    "consensus": [{"n", task: cells}], "singles": [{"block", "metrics", "delta"}], "predictors": {task: {...}}}``."""
    from swapkl.measure import lmeval
    from swapkl.measure.prefix import PrefixStore
    from swapkl.measure.task_runner import TaskRunner
    from swapkl.removal.plan import RunHooks
    from swapkl.removal.selection import layer_scores

    st = settings_of(plan.tasks)
    ip = lmeval.check_include_path(st.include_path) if st.include_path else None
    tm, loaded = lmeval.load_tasks(ip, st.tasks)
    sets = {m: [list(e["removed"]) for e in curves.methods[m]] for m in TASK_METHODS if m in curves.methods}
    layer = {p: layer_scores(scores[p]) for p in ("replacement", "interchange")}
    blocks = [k for k in range(1, ck.num_layers - 1) if all(np.isfinite(layer[p][k]) for p in layer)]
    every = [s for v in sets.values() for s in v if s] + [[k] for k in blocks]
    run = TaskRunner(ck.model, ck.tokenizer, loaded, tm, identity=ck.identity, settings=st,
                     hooks=RunHooks(should_stop=should_stop), total=1 + len(every))
    if st.share_prefix:
        run.prefix = PrefixStore(min(s) for s in every)
        run.record_base = run.worth_recording(every)
    base = run.variant(())
    names = [t for t in base["docs"]]
    docs = {m: {k + 1: run.variant(s)["docs"] for k, s in enumerate(v)} for m, v in sets.items()}
    methods = {m: [{"n": k + 1, "removed": s, "metrics": run.variant(s)["metrics"],
                    "delta": {t: delta(base["docs"], docs[m][k + 1], t, n_boot=plan.n_boot) for t in names}}
                   for k, s in enumerate(v)] for m, v in sets.items()}
    ns = sorted(set(docs.get("replacement", {})) & set(docs.get("interchange", {})))
    i_vs_r = []
    for n in ns:
        row = {"n": n}
        for t in names:
            d = mean_diff(*_scores(docs["replacement"][n], docs["interchange"][n], t), plan.n_boot)
            row[t] = d | {"word": _word(d["ci"])}
        i_vs_r.append(row)
    singles = {k: run.variant([k])["docs"] for k in blocks}
    return {"contract": {"tasks": list(st.tasks), "limit": st.limit, "num_fewshot": st.num_fewshot,
                         "lm_eval_version": run.lm_eval_version,
                         "versions": {t["name"]: t["versions"] for t in loaded}},
            "base": {"metrics": base["metrics"]}, "methods": methods, "i_vs_r": i_vs_r,
            "consensus": [{"n": n, **{t: consensus_cells(docs, n, t, plan.n_boot) for t in names}} for n in ns],
            "singles": [{"block": k, "metrics": run.variant([k])["metrics"],
                         "delta": {t: delta(base["docs"], singles[k], t, n_boot=plan.n_boot) for t in names}}
                        for k in blocks],
            "predictors": {t: _rho(layer, blocks, base["docs"], singles, t, plan.n_boot) for t in names}
            if len(blocks) >= 3 else {}}
