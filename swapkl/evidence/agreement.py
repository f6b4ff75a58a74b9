"""Rank agreement between layer signals and the ground truth (docs/evidence.md §3).

Point values are :func:`scipy.stats.spearmanr` / :func:`scipy.stats.kendalltau` (tau-b) on the emitted vectors,
over the layers where both are finite.  CIs: one joint bootstrap; replicate b draws the scoring prompts (signals
with per-prompt values are recomputed) and, independently, the evaluation windows (the ground truth is recomputed,
paired with its baseline); every coefficient of replicate b comes from the same draws, so differences between two
signals' coefficients are paired.  Per replicate the coefficients are computed by :func:`spearman_rows` /
:func:`kendall_rows`, the same definitions vectorised (tests check them against scipy).
"""
from __future__ import annotations

import numpy as np

from swapkl.stats import bootstrap_indices, finite_ci, kendall, kendall_rows, spearman, spearman_rows, tie

GT_NAMES = ("ground_truth_ppl", "ground_truth_kl")


def replicate_vectors(signals, gt, num_prompts: int, n_boot: int, seed: int = 0, extra_truths=None,
                      task_truth=None) -> dict:
    """``{name: (n_boot, L)}``: every signal and both ground truths under the joint bootstrap (module docstring).
    Signals without per-prompt values stay at their full-sample value.  ``extra_truths`` ({name: (GroundTruth,
    "ppl" or "kl")} on the same windows as ``gt``, e.g. the bridged ground truth) are resampled with the same window
    draws (their ΔPPL % or KL under ``name``), so every coefficient stays paired.  ``task_truth`` (a
    :class:`~swapkl.evidence.task_truth.TaskTruth`): its documents are drawn next from the same stream (one draw
    per task, replicate b with the prompts and windows of replicate b); its accuracy loss goes under
    :data:`~swapkl.evidence.task_truth.GT_ACC` (the mean over tasks) and ``GT_ACC:task`` (each task)."""
    rng = np.random.default_rng(seed)  # one stream: the prompt draws, then the window draws
    pidx = bootstrap_indices(max(1, num_prompts), n_boot, rng)
    widx = bootstrap_indices(len(gt.counts), n_boot, rng)
    out = {}
    for s in signals:
        out[s.name] = s.resample(pidx) if s.resample is not None else np.repeat(s.values[None], n_boot, 0)
    d, k = gt.resampled(widx)
    out[GT_NAMES[0]], out[GT_NAMES[1]] = d, k
    for name, (other, which) in (extra_truths or {}).items():
        if len(other.counts) != len(gt.counts):
            raise ValueError(f"{name}: {len(other.counts)} windows, the ground truth has {len(gt.counts)}")
        out[name] = other.resampled(widx)[0 if which == "ppl" else 1]
    if task_truth is not None:
        from swapkl.evidence.task_truth import GT_ACC

        didx = {t: bootstrap_indices(task_truth.n_docs(t), n_boot, rng) for t in task_truth.tasks}
        draws = task_truth.resampled(didx)
        out[GT_ACC] = draws.pop("mean")
        out.update({f"{GT_ACC}:{t}": v for t, v in draws.items()})
    return out


def agreement(vectors: dict, replicates: dict) -> dict:
    """Spearman and Kendall between every pair of ``vectors`` ({name: (L,)}) with 95 % CIs from ``replicates``
    ({name: (B, L)}).  Returns ``{"spearman": {a: {b: ρ}}, "spearman_ci": {a: {b: [lo, hi]}}, "kendall": ...,
    "kendall_ci": ...}``."""
    names = list(vectors)
    out = {"spearman": {}, "kendall": {}, "spearman_ci": {}, "kendall_ci": {}}
    for a in names:
        for key in out:
            out[key][a] = {}
    for ia, a in enumerate(names):
        for b in names[ia:]:
            m = np.isfinite(vectors[a]) & np.isfinite(vectors[b])
            for key, point, rows in (("spearman", spearman, spearman_rows), ("kendall", kendall, kendall_rows)):
                v = point(vectors[a], vectors[b]) if a != b else 1.0
                ci = finite_ci(rows(replicates[a][:, m], replicates[b][:, m])) if a != b else [1.0, 1.0]
                out[key][a][b] = out[key][b][a] = v
                out[key + "_ci"][a][b] = out[key + "_ci"][b][a] = ci
    return out


def compare_to(truth: str, signal_names, vectors: dict, replicates: dict) -> dict:
    """Which signal predicts ``truth`` best (Spearman), and every other signal against it: the paired bootstrap CI
    of ρ(best) - ρ(other) and ``"indistinguishable"`` (CI includes 0) or ``"worse"``."""
    rho = {s: spearman(vectors[s], vectors[truth]) for s in signal_names}
    ranked = sorted((s for s in signal_names if np.isfinite(rho[s])), key=lambda s: -rho[s])
    if not ranked:
        return {"truth": truth, "best": None, "rho": rho, "others": {}}
    best = ranked[0]
    m_t = np.isfinite(vectors[truth])
    reps = {}
    for s in ranked:
        m = m_t & np.isfinite(vectors[s])
        reps[s] = spearman_rows(replicates[s][:, m], replicates[truth][:, m])
    others = {}
    for s in ranked[1:]:
        lo, hi = finite_ci(reps[best] - reps[s])
        others[s] = {"rho": rho[s], "diff_ci": [lo, hi],
                     "verdict": "indistinguishable" if tie([lo, hi]) else "worse"}
    return {"truth": truth, "best": best, "rho": rho, "best_ci": finite_ci(reps[best]), "others": others}


def against_ground_truth(signals, gt, num_prompts: int, n_boot: int, task_truth=None, replicates: dict | None = None):
    """Every signal against the ground truths, as the evidence report states it: ``(vectors, agreement,
    comparison)`` with ``vectors`` {name: (L,)} (signals, then :data:`GT_NAMES`, then ``ground_truth_acc`` with a
    ``task_truth``), :func:`agreement` between all of them under the joint bootstrap, and ``comparison``
    ``{"ground_truth_ppl": compare_to(ΔPPL), "ground_truth_kl": compare_to(KL)[, "ground_truth_acc": ...]}``.
    ``replicates``: a dict that receives the replicate vectors (the task truth's record reads its draws)."""
    vectors = {s.name: np.asarray(s.values, float) for s in signals}
    vectors[GT_NAMES[0]] = np.asarray(gt.delta_ppl_pct)
    vectors[GT_NAMES[1]] = np.asarray(gt.kl)
    truths = list(GT_NAMES)
    if task_truth is not None:
        from swapkl.evidence.task_truth import GT_ACC

        vectors[GT_ACC] = np.asarray(task_truth.loss()["mean"], float)
        truths.append(GT_ACC)
    reps = replicate_vectors(signals, gt, num_prompts, n_boot, task_truth=task_truth)
    if replicates is not None:
        replicates.update(reps)
    names = [s.name for s in signals]
    return vectors, agreement(vectors, reps), {t: compare_to(t, names, vectors, reps) for t in truths}


def ground_truth_record(gt) -> dict:
    """The ``ground_truth`` entry of the evidence report: per-layer ΔPPL % and KL with their CIs, the baseline
    perplexity and the number of held-out windows."""
    return {"delta_ppl_pct": gt.delta_ppl_pct, "kl": gt.kl, "delta_ppl_pct_ci": gt.delta_ppl_pct_ci,
            "kl_ci": gt.kl_ci, "baseline_ppl": gt.baseline_ppl, "n_windows": int(len(gt.counts))}


def headline(cmp: dict, what: str = "single-layer removal cost (held-out ΔPPL)") -> str:
    """One sentence: the best predictor with its ρ and CI, those indistinguishable from it, those significantly worse."""
    best = cmp.get("best")
    if best is None:
        return "no signal could be ranked against the ground truth"
    lo, hi = cmp["best_ci"]
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    s = f"on this checkpoint {best} predicts {what} best (ρ = {cmp['rho'][best]:.2f}{ci})"
    return s + verdict_tail(cmp["others"]) + "."


def verdict_tail(others: dict) -> str:
    """"; a, b are indistinguishable from it; c is significantly worse" from ``{name: {"verdict": ...}}``."""
    s = ""
    same = [k for k, v in others.items() if v["verdict"] == "indistinguishable"]
    worse = [k for k, v in others.items() if v["verdict"] == "worse"]
    if same:
        s += f"; {', '.join(same)} {'is' if len(same) == 1 else 'are'} indistinguishable from it"
    if worse:
        s += f"; {', '.join(worse)} {'is' if len(worse) == 1 else 'are'} significantly worse"
    return s
