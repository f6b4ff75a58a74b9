"""Which per-layer definition predicts the removal cost better (docs/method.md §1, docs/evidence.md).

The evidence's swap signals are measured under the contract's definition (``slot`` or ``block``); here the other
definition is scored too (cached like any score), and each protocol's layer signal under each definition is ranked
against the single-layer removal ground truth: Spearman ρ with its CI and the paired bootstrap CI of the difference
ρ(slot) − ρ(block) on the same prompt and window draws (a tie when it includes 0).  On a stack whose layers all
have the same settings the two definitions give the same matrices: the result says they coincide and compares
nothing.
"""
from __future__ import annotations

import numpy as np

from swapkl.contract import PER_LAYER
from swapkl.evidence import agreement as A
from swapkl.stats import finite_ci, side

#: relative difference below which the two definitions' matrices count as the same numbers
SAME = 1e-6


def same_numbers(a, b) -> bool:
    """Whether two :class:`~swapkl.scoring.results.SwapResult` hold the same pairs and the same matrices (to
    :data:`SAME` relative)."""
    if sorted(a.pairs) != sorted(b.pairs):
        return False
    for m1, m2 in ((a.replacement(), b.replacement()), (a.interchange(), b.interchange())):
        ok = np.isfinite(m1)
        if not np.array_equal(ok, np.isfinite(m2)):
            return False
        if ok.any() and np.max(np.abs(m1[ok] - m2[ok]) / np.maximum(np.abs(m1[ok]), 1e-12)) > SAME:
            return False
    return True


def compare_definitions(ck, contract, res, gt, n_boot: int, use_cache: bool = True, should_stop=None) -> dict:
    """``{"coincide", "statement", "protocols": {protocol: {"rho": {definition: ρ}, "rho_ci": {...},
    "diff_ci": [lo, hi], "better": definition or "tie"}}, "undefined": {definition: pairs}}`` for checkpoint ``ck``
    whose scores under ``contract`` are ``res`` and whose single-layer ground truth is ``gt``."""
    from swapkl.evidence.signals import swap_signals
    from swapkl.scoring.score import score

    other = next(d for d in PER_LAYER if d != contract.per_layer)
    results = {contract.per_layer: res,
               other: score(ck, contract.with_(per_layer=other), use_cache=use_cache, should_stop=should_stop)}
    out = {"undefined": {d: len(r.undefined) for d, r in results.items()}, "protocols": {}}
    if same_numbers(results["slot"], results["block"]):
        out.update(coincide=True, statement="the two per-layer definitions (slot, block) coincide on this model: every "
                                            "layer has the same settings, so one set of numbers answers both")
        return out
    signals, names = [], {}
    for d in PER_LAYER:
        for s in swap_signals(results[d]):
            s.name = f"{s.name} ({d})"
            names.setdefault(s.name.split(" (")[0], {})[d] = s.name
            signals.append(s)
    vectors = {s.name: np.asarray(s.values, float) for s in signals}
    truth = A.GT_NAMES[0]
    vectors[truth] = np.asarray(gt.delta_ppl_pct)
    reps = A.replicate_vectors(signals, gt, res.num_prompts, n_boot)
    parts = []
    for protocol, by_def in names.items():
        rho, rows, ci = {}, {}, {}
        for d, name in by_def.items():
            m = np.isfinite(vectors[name]) & np.isfinite(vectors[truth])
            rho[d] = A.spearman(vectors[name], vectors[truth])
            rows[d] = A.spearman_rows(reps[name][:, m], reps[truth][:, m])
            ci[d] = finite_ci(rows[d])
        lo, hi = finite_ci(rows["slot"] - rows["block"])
        better = side([lo, hi], below="block", above="slot")
        out["protocols"][protocol] = {"rho": rho, "rho_ci": ci, "diff_ci": [lo, hi], "better": better}
        gap = f"ρ(slot) − ρ(block) CI [{lo:.2f}, {hi:.2f}]" if lo is not None else "no CI"
        parts.append(f"{protocol}: slot ρ = {rho['slot']:.2f}, block ρ = {rho['block']:.2f}, {gap}: "
                     + ("a tie" if better == "tie" else f"{better} predicts better"))
    out.update(coincide=False, statement="which definition predicts the single-layer removal cost (held-out ΔPPL): "
                                         + "; ".join(parts))
    return out
