"""The recommendation rule of ``docs/recommend-rule.md``: anchor on the protocol rule's
zero-evaluation set; depart to the beam's calibration-best set only when K disjoint calibration regions agree.

Pure statistics (:func:`paired_nll_diff`, :func:`anchor_protocol`) plus :func:`confirm`, which evaluates the two sets
on the calibration regions through a :class:`~swapkl.removal.methods.base.MethodContext` (memoised like every
calibration evaluation).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from swapkl.errors import SwapklError
from swapkl.scoring.verdict import regime_verdict
from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, percentile_ci  #: the rule's defaults (docs/recommend-rule.md)
DEFAULT_RULE = "confirmed"
DEFAULT_REGIONS = 3
RULES = ("confirmed", "calibration")


def paired_nll_diff(a_nll: np.ndarray, a_counts: np.ndarray, b_nll: np.ndarray, b_counts: np.ndarray,
                    n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """Per-token mean NLL difference ``a − b`` (nats) over shared windows, with its paired bootstrap 95 % CI.

    ``*_nll``: (W,) summed NLL per window; ``*_counts``: (W,) scored tokens per window (equal for a and b: the same
    windows).  Resample b draws W windows with replacement; both sets are read on the same draws.  Returns
    ``{"diff", "ci": [lo, hi], "windows"}``."""
    a_nll, b_nll = np.asarray(a_nll, float), np.asarray(b_nll, float)
    a_counts, b_counts = np.asarray(a_counts), np.asarray(b_counts)
    if a_nll.shape != b_nll.shape or not np.array_equal(a_counts, b_counts):
        raise SwapklError("a paired NLL difference needs two evaluations on the same windows")
    idx = bootstrap_indices(len(a_nll), n_boot, seed)
    d = (a_nll[idx].sum(1) - b_nll[idx].sum(1)) / a_counts[idx].sum(1)
    return {"diff": float((a_nll.sum() - b_nll.sum()) / a_counts.sum()),
            "ci": percentile_ci(d), "windows": int(len(a_nll))}


def anchor_protocol(scores: dict) -> tuple[str | None, str]:
    """Which guided protocol anchors the rule: ``("interchange" | "replacement" | None, why)``.  None: the verdict
    prefers neither protocol (tied, weak), or the verdict could not be formed: the caller breaks the tie on
    calibration region 1."""
    have = [p for p in ("replacement", "interchange") if p in scores]
    if not have:
        return None, "no swap-KL scores"
    if len(have) == 1:
        return have[0], f"only {have[0]} scores"
    try:
        v = regime_verdict(scores["replacement"], scores["interchange"])
    except SwapklError as e:
        return None, f"no verdict ({e})"
    if v["prefer"] in ("interchange", "replacement"):
        return v["prefer"], f"{v['regime']} regime: the verdict prefers {v['prefer']}-guided removal"
    return None, f"{v['regime']} regime: the verdict prefers neither protocol"


def pick_anchor(level_seeds: Sequence[tuple], scores: dict, calib) -> tuple[frozenset | None, str | None, str]:
    """The anchor set among a level's seeds ``[(set, method), ...]``: ``(set, method, why)``; ``calib(set)`` is the
    calibration-region-1 PPL (breaks a tie between the two guided sets).  ``(None, None, why)`` without one."""
    guided = {src: s for s, src in level_seeds if src in ("replacement", "interchange")}
    proto, why = anchor_protocol(scores)
    if proto is not None and proto in guided:
        return guided[proto], proto, why
    if not guided:
        return None, None, why + "; no guided set at this n"
    best = min(sorted(guided), key=lambda p: (calib(guided[p]), p))
    return guided[best], best, why + f"; {best}-guided has the lower calibration PPL on region 1"


def confirm(ctx, anchor: frozenset, challenger: frozenset, tokens: int, stride, regions: int) -> dict:
    """Evaluate ``anchor`` and ``challenger`` on calibration regions ``0..regions-1`` (as many as the prompt region
    holds) and decide: ``{"depart": bool, "regions": k, "per_region": [{"anchor", "challenger"} mean NLL nats],
    "diff": nats, "ci": [lo, hi], "reason"}``.  Departs only when the challenger's mean NLL is lower on every
    region and the pooled paired CI of ``challenger − anchor`` lies below 0; never with fewer than 2 regions."""
    res_a, res_c, per = [], [], []
    for k in range(regions):
        try:
            a = ctx.calib_result(sorted(anchor), tokens, stride=stride, region=k)
            c = ctx.calib_result(sorted(challenger), tokens, stride=stride, region=k)
        except SwapklError:
            if k == 0:
                raise
            break  # the prompt region holds only k regions
        res_a.append(a)
        res_c.append(c)
        per.append({"anchor": a.mean_nll, "challenger": c.mean_nll})
    k = len(per)
    stat = paired_nll_diff(np.concatenate([r.nll for r in res_c]), np.concatenate([r.counts for r in res_c]),
                           np.concatenate([r.nll for r in res_a]), np.concatenate([r.counts for r in res_a]))
    every = all(p["challenger"] < p["anchor"] for p in per)
    if k < 2:
        depart, reason = False, "fewer than 2 calibration regions: never depart"
    elif every and stat["ci"][1] < 0:
        depart, reason = True, f"lower calibration NLL on all {k} regions, pooled paired CI below 0"
    elif not every:
        depart, reason = False, f"lower calibration NLL on {sum(p['challenger'] < p['anchor'] for p in per)} of {k} regions"
    else:
        depart, reason = False, f"lower on all {k} regions but the pooled paired CI includes 0"
    return {"depart": depart, "regions": k, "per_region": per, "diff": stat["diff"], "ci": stat["ci"],
            "windows": stat["windows"], "reason": reason}
