"""Recommend, judged fairly (``docs/recommend-rule.md``): at each n, the held-out ΔPPL of the
recommended set against every other method's set on the **same windows**, as a paired bootstrap CI of the
difference with the words better / tie / worse.

Pure over evaluations: :func:`paired_delta` takes per-window NLLs; :func:`paired_comparisons` reads a finished
curves result's evaluations back from its memo (nothing is evaluated again).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, delta_ppl_draws, percentile_ci, side  #: methods that measure perplexity of candidate sets to choose one; every other method is zero-evaluation
EVALUATING = ("sleb", "recommend")
FOCUS = "recommend"


def word(ci: Sequence[float]) -> str:
    """``better`` when the CI of (focus − other) lies below 0, ``worse`` above 0, ``tie`` when it includes 0."""
    return side(ci)


def paired_delta(focus_nll: np.ndarray, others_nll: Sequence[np.ndarray], base_nll: np.ndarray, counts: np.ndarray,
                 n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """ΔPPL % (focus) − mean over ``others_nll`` of ΔPPL % (other), with its paired bootstrap 95 % CI.

    Every array is (W,) over the same windows: summed NLL in nats per window; ``counts`` (W,) scored tokens.  One
    other = a method's set; several = the seeds of a seeded method (its mean curve).  Each resample draws W windows
    with replacement (``bootstrap_indices``' draws: seed 0) and recomputes every ΔPPL against the baseline on those
    draws.  Returns ``{"diff" (percentage points), "ci": [lo, hi], "word"}``."""
    idx = bootstrap_indices(len(counts), n_boot, seed)

    def delta(nll, pick=None):
        if pick is None:
            return 100.0 * (np.exp((nll.sum() - base_nll.sum()) / counts.sum()) - 1.0)
        return delta_ppl_draws(nll, base_nll, counts, idx)

    point = delta(focus_nll) - np.mean([delta(o) for o in others_nll])
    draws = delta(focus_nll, True) - np.mean([delta(o, True) for o in others_nll], axis=0)
    ci = percentile_ci(draws)
    return {"diff": float(point), "ci": ci, "word": word(ci)}


def _sets(result, name: str, n: int) -> list[list[int]] | None:
    """The removal sets of ``name`` at n (one, or one per seed); None when it has none or merges."""
    if name in (result.random_seeds or {}):
        sets = [v[n - 1]["removed"] for v in result.random_seeds[name].values() if len(v) >= n]
        return sets or None
    entries = [e for e in result.methods.get(name, []) if e["n"] == n]
    if not entries or entries[0].get("merge") or entries[0].get("removed") is None:
        return None
    return [entries[0]["removed"]]


def paired_comparisons(result, lookup: Callable[[Sequence[int]], object], baseline, focus: str = FOCUS) -> list[dict]:
    """Per n, ``focus``'s set against every other method of ``result`` (a :class:`CurvesResult`), read through
    ``lookup(removed) -> PPLResult | None`` (the run's memo) on the baseline's windows.

    Returns ``[{"n", "removed", "comparisons": [{"method", "removed" (list of sets), "zero_eval", "delta_pct",
    "diff", "ci", "word"}], "best_zero_eval": method or None, "vs_best_zero_eval": word or None}]``; merges are
    skipped (their evaluations live under another key)."""
    out = []
    for e in result.methods.get(focus, []):
        n = e["n"]
        f = lookup(e["removed"])
        if f is None:
            continue
        rows = []
        for name, entries in result.methods.items():
            sets = None if name == focus else _sets(result, name, n)
            evals = [lookup(s) for s in sets] if sets else []
            if not evals or any(r is None for r in evals):
                continue
            st = paired_delta(f.nll, [r.nll for r in evals], baseline.nll, baseline.counts)
            other = next(x for x in entries if x["n"] == n)
            rows.append({"method": name, "removed": sets, "zero_eval": name not in EVALUATING,
                         "delta_pct": other["delta_pct"]} | st)
        zero = [r for r in rows if r["zero_eval"]]
        best = min(zero, key=lambda r: r["delta_pct"]) if zero else None
        out.append({"n": n, "removed": e["removed"], "delta_pct": e["delta_pct"], "comparisons": rows,
                    "best_zero_eval": best["method"] if best else None,
                    "vs_best_zero_eval": best["word"] if best else None})
    return out
