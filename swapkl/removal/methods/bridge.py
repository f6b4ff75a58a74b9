"""Bridge-guided removal (docs/repair.md, "Removal with repair"): each candidate block alone is replaced by its linear
bridge (the span ``[l, l+1)``, folded where an exact fold exists, else residual), scored by the bridged KL on the
scoring prompts, ``mean over prompts of KL(base ‖ model with block l bridged)`` (nats, per block; the third matrix's
machinery, :class:`swapkl.repair.sweep.BridgedSweep`), and the sets are chosen from that per-block score by the
guided methods' rule: lowest first, the run's candidates, spacing Δ and boundary (:func:`swapkl.removal.selection.scan`),
nested.

The bridges and the prompts are the run's (``ctx.bridger``) when it repairs with a bridge, so the sets are scored
with the very bridges their curve is evaluated with; without ``--repair bridge`` the method fits its own with the
default bridge settings (its ``calib_tokens`` from ``--calib-tokens``) and its sets are evaluated raw.
"""
from __future__ import annotations

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens
from swapkl.removal.selection import nested, scan

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "bridge", "run": "bridge",
     "description": "bridge-guided: lowest bridged KL first (each candidate block replaced by its least-squares "
                    "linear bridge, KL to the base model on the scoring prompts), under the guided rule",
     "label": "bridge-guided", "offered": True, "order": 2, "calibration": 8192,
     "style": {"color": "#2ca02c", "width": 3.0, "marker": 9}},
]

# torch and the torch-based swapkl modules are imported inside the functions (the registry reads this file without
# importing it; the CLI's --help must not load torch).


def block_scores(bridger, candidates) -> dict[int, float]:
    """``{l: mean over the bridger's scoring prompts of KL(base ‖ block l bridged)}`` (nats) for ``candidates``."""
    import torch

    from swapkl.repair.bridge import captured_blocks
    from swapkl.repair.sweep import BridgedSweep

    bridges = bridger.span_bridges([(int(c), int(c) + 1) for c in candidates])
    c = bridger.contract
    sweep = BridgedSweep(bridger.model, bridger.prompts.ids, c.positions, getattr(torch, c.kl_dtype),
                         folded=captured_blocks(bridges))
    vecs = sweep.sweep(bridges)
    return {b.start: float(vecs[(b.start, b.end)]["bridged"].double().mean()) for b in bridges}


def bridge(ctx, budget):
    from swapkl.removal.bridging import finish_notes, method_bridger

    bridger, own = method_bridger(ctx, calib_tokens(ctx, "bridge"))
    scores = block_scores(bridger, ctx.candidates)
    order = sorted(scores, key=lambda k: (scores[k], k))
    sets = nested(scan(order, budget, ctx.spacing))
    out = MethodOutput(sets=sets,
                       info={"layer_scores": [scores.get(k) for k in range(ctx.num_layers)],
                             "fits": {f"{k}-{k + 1}": bridger.fits[(k, k + 1)].summary() for k in scores}},
                       settings={"score": "mean KL(base || block bridged) on the scoring prompts, nats",
                                 "spacing": ctx.spacing, "candidates": list(ctx.candidates),
                                 "calib_tokens": bridger.settings.calib_tokens, "bridge": bridger.settings.to_dict()})
    if len(sets) < budget:
        out.notes.append(f"the score order stops after {len(sets)} layers under spacing Δ={ctx.spacing}")
    finish_notes(out, bridger, own)
    return out
