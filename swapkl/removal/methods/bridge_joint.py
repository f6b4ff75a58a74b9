"""Bridge-guided removal, measured jointly (docs/repair.md, "Removal with repair"): SLEB's iteration on the bridged
KL.  Starting from nothing, each step tries every admissible candidate block ``c``, removes the set ``S ∪ {c}`` with
one least-squares bridge per maximal run of consecutive removed blocks (a block next to a run extends that run and
its one bridge is refitted over the longer span), scores it by ``mean over the scoring prompts of KL(base ‖ that
model)`` (nats, :class:`swapkl.repair.joint_kl.JointKL`) and keeps the lowest (ties: the lower index); the sets
are nested.

It sees what the per-block ``bridge`` method cannot: what several bridges cost together, and that a contiguous span
needs one bridge where scattered blocks need one each.  The rule's candidates (boundary) apply; the spacing Δ
applies between separate runs (two blocks of different runs are more than Δ apart), not inside a run, since a run is
one repair.  All spans a step needs are fitted in one calibration pass.  With ``--repair bridge`` it uses the run's
bridges and scoring prompts (``ctx.bridger``); without, it fits its own (default bridge settings, ``--calib-tokens``)
and its sets are evaluated raw.  Cost: about ``budget × candidates`` forwards of the scoring prompts.
"""
from __future__ import annotations

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens
from swapkl.removal.selection import nested

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "bridge-joint", "run": "bridge_joint",
     "description": "bridge-guided, joint: repeatedly remove the block whose removal, with one least-squares bridge "
                    "per run of removed blocks, gives the lowest KL to the base model on the scoring prompts",
     "label": "bridge-guided (joint)", "offered": True, "order": 3, "calibration": 8192,
     "style": {"color": "#17becf", "width": 3.0, "marker": 9}},
]


def admissible(removed, spacing: int) -> bool:
    """Whether the maximal runs of ``removed`` are pairwise more than ``spacing`` apart (blocks of different runs
    differ by more than Δ; inside a run nothing is asked)."""
    from swapkl.repair.bridge import spans_of

    spans = spans_of(sorted(removed))
    return all(b[0] - a[1] >= spacing for a, b in zip(spans, spans[1:]))


def bridge_joint(ctx, budget):
    import torch

    from swapkl.errors import ComputeInterrupted
    from swapkl.removal.bridging import finish_notes, method_bridger
    from swapkl.repair.bridge import spans_of
    from swapkl.repair.joint_kl import JointKL

    bridger, own = method_bridger(ctx, calib_tokens(ctx, "bridge-joint"))
    c = bridger.contract
    kl = JointKL(bridger.model, bridger.prompts.ids, c.positions, getattr(torch, c.kl_dtype))
    picks: list[int] = []
    steps = []
    for step in range(budget):
        if ctx.should_stop is not None and ctx.should_stop():
            raise ComputeInterrupted(f"bridge-joint stopped after {step} steps")
        trial = [k for k in ctx.candidates if k not in picks and admissible(picks + [k], ctx.spacing)]
        if not trial:
            break
        bridger.fit_spans({sp for k in trial for sp in spans_of(picks + [k])})
        score = {k: float(kl(bridger.bridged(picks + [k])).mean()) for k in trial}
        best = min(trial, key=lambda k: (score[k], k))
        picks.append(best)
        steps.append({"step": step + 1, "removed": best, "kl": score[best], "trials": {str(k): v for k, v in score.items()}})
        if ctx.progress is not None:
            ctx.progress(None, None, f"bridge-joint step {step + 1}: remove {best} (bridged KL {score[best]:.4g} nats)")
    first = steps[0]["trials"] if steps else {}
    out = MethodOutput(sets=nested(picks),
                       info={"steps": steps, "layer_scores": [first.get(str(k)) for k in range(ctx.num_layers)],
                             "fits": {f"{i}-{j}": bridger.fits[(i, j)].summary()
                                      for i, j in spans_of(picks)}},
                       settings={"score": "mean KL(base || set removed, one bridge per run) on the scoring prompts, "
                                          "nats", "spacing": ctx.spacing, "spacing_applies": "between runs",
                                 "candidates": list(ctx.candidates), "calib_tokens": bridger.settings.calib_tokens,
                                 "bridge": bridger.settings.to_dict()})
    if len(picks) < budget:
        out.notes.append(f"stops after {len(picks)} layers under spacing Δ={ctx.spacing}")
    finish_notes(out, bridger, own)
    return out
