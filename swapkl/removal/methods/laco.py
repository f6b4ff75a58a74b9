"""LaCo-style merge baseline: merge the adjacent pair with the lowest swap-KL score instead of deleting a block.

At budget n the n adjacent pairs ``(l, l+1)`` with the lowest pair score (``params["laco"]["protocol"]``:
``"replacement"`` = d_repl (default) or ``"interchange"`` = d_inter; NaN pairs skipped; ties by index) are merged:
each run of chosen pairs forms one group of consecutive blocks, merged into its lowest slot, the other members
removed (:mod:`swapkl.surgery.merge`).  Merge formula ``params["laco"]["mode"]``: ``"average"`` (every parameter averaged,
as the paper's scripts do; default) or ``"laco"`` (θ_l + Σ_k (θ_{l+k} − θ_l), the original LaCo).  The upper
member of a pair must be one of the rule's candidates (so the first layer is never removed, the last by default
not either).  The sets are nested (pairs are added in score order).
"""
from __future__ import annotations

import numpy as np

from swapkl.removal.methods.base import MethodOutput
from swapkl.errors import SwapklError

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "laco", "run": "laco",
     "description": "LaCo-style merge: the adjacent pair with the lowest swap-KL merged (parameters averaged) into the lower slot, the upper block removed",
     "label": "LaCo merge", "offered": True, "order": 9, "variants": ["merge"]},
]


def merge_order(d, candidates) -> list[tuple[int, int]]:
    """Adjacent pairs ``(l, l+1)`` with ``l+1`` in ``candidates``, by ascending ``d`` (symmetrised; NaN skipped)."""
    d = np.asarray(d, dtype=float)
    pairs = []
    for lo in range(len(d) - 1):
        if lo + 1 not in set(candidates):
            continue
        v = d[lo, lo + 1] if not np.isnan(d[lo, lo + 1]) else d[lo + 1, lo]
        if not np.isnan(v):
            pairs.append((float(v), lo, lo + 1))
    pairs.sort()
    return [(a, b) for _, a, b in pairs]


def laco(ctx, budget):
    protocol = ctx.param("laco", "protocol", "replacement" if "replacement" in ctx.scores else "interchange")
    mode = ctx.param("laco", "mode", "average")
    if protocol not in ctx.scores:
        raise SwapklError(f"laco needs {protocol} scores")
    from swapkl.surgery.merge import groups_from_pairs  # deferred: swapkl.merge imports torch (the registry must not)

    order = merge_order(ctx.scores[protocol], ctx.candidates)
    sets, groups = [], []
    for k in range(1, min(budget, len(order)) + 1):
        g = groups_from_pairs(order[:k])
        groups.append(g)
        sets.append(sorted(i for grp in g for i in grp[1:]))
    out = MethodOutput(sets=sets, variant={"kind": "merge", "mode": mode, "groups": groups},
                       info={"merge_order": [list(p) for p in order[:budget]], "groups": groups},
                       settings={"protocol": protocol, "mode": mode, "candidates": list(ctx.candidates)})
    if len(sets) < budget:
        out.notes.append(f"only {len(sets)} adjacent pairs are scored with an upper member among the candidates")
    return out
