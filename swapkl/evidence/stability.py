"""Stability of the chosen sets under a bootstrap of the scoring prompts (docs/evidence.md §4).

For each signal with per-prompt values, B resamples of the prompts (default 200) recompute the per-layer scores and
the selection rule picks a set at every n = 1..budget: ``frequency[ℓ]`` = share of resamples whose set holds ℓ
(the frequencies sum to n when every resample reaches n), ``same_set`` = share whose set equals the full-sample
set, ``unstable`` when ``same_set < 0.8``.  Rules: ``guided`` (replacement, interchange) = the swap-KL rule
(ascending layer score over its candidates, spacing Δ); ``lowest`` (BI, angular at block size 1) = the literature
rule (every layer, no spacing); the angular *method* (block of n consecutive layers) is resampled from the
per-prompt distance matrices.
"""
from __future__ import annotations

import numpy as np

from swapkl.removal.selection import scan
from swapkl.stats import bootstrap_indices

UNSTABLE_BELOW = 0.8


def pick(scores: np.ndarray, n: int, candidates, spacing: int) -> list[int]:
    """The first ``n`` picks of ascending ``scores`` over ``candidates`` (NaN skipped) under ``spacing``, sorted."""
    order = sorted((c for c in candidates if np.isfinite(scores[c])), key=lambda c: (scores[c], c))
    return sorted(scan(order, n, spacing))


def memberships(sets: list[list[int]], L: int) -> np.ndarray:
    """(B, L) 0/1: which layers each resample's set holds."""
    m = np.zeros((len(sets), L))
    for b, s in enumerate(sets):
        m[b, list(s)] = 1.0
    return m


def summarise(full: list[int], sets: list[list[int]], L: int) -> dict:
    m = memberships(sets, L)
    same = float(np.mean([sorted(s) == sorted(full) for s in sets])) if sets else float("nan")
    return {"set": sorted(int(i) for i in full), "frequency": m.mean(0).tolist(), "same_set": same,
            "unstable": bool(same < UNSTABLE_BELOW)}


def signal_stability(values: np.ndarray, reps: np.ndarray, budget: int, candidates, spacing: int) -> dict:
    """``{"<n>": {"set", "frequency", "same_set", "unstable"}}`` for one signal (full-sample ``values`` (L,),
    resampled ``reps`` (B, L))."""
    L = len(values)
    out = {}
    for n in range(1, budget + 1):
        full = pick(values, n, candidates, spacing)
        if len(full) < n:  # the rule's order stops short of n under the spacing rule: no set of size n
            break
        out[str(n)] = summarise(full, [pick(r, n, candidates, spacing) for r in reps], L)
    return out


def angular_stability(ang: np.ndarray, idx: np.ndarray, budget: int) -> dict:
    """The angular method's block sets under prompt resamples: ``ang`` (P, L+1, L+1) per-prompt distances."""
    from swapkl.removal.methods.angular import best_blocks

    L = ang.shape[1] - 1
    full = best_blocks(ang.mean(0), budget)
    per = [best_blocks(ang[i].mean(0), budget) for i in idx]
    return {str(n): summarise(full[n - 1], [p[n - 1] for p in per], L) for n in range(1, budget + 1)}


def prompt_bootstrap(num_prompts: int, n_boot: int = 200, seed: int = 1) -> np.ndarray:
    """(n_boot, P) prompt indices drawn with replacement (fixed seed)."""
    return bootstrap_indices(num_prompts, n_boot, seed)
