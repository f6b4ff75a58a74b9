"""SLEB-iterative: repeatedly remove the single block whose removal gives the lowest perplexity on calibration
text (the corpus's prompt region, never the test text), re-scoring after each removal.

Literature default: every layer is a candidate, no spacing rule (``params["sleb"] = {"constrained": True}``
applies the guided methods' candidates and spacing).  Trial sets go through the run's memo (keyed by text and
removed set), so step k re-uses nothing it already evaluated and a later call with a larger budget re-uses all
earlier steps.  Cost: sum over steps of (candidates left) calibration evaluations.
"""
from __future__ import annotations

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "sleb", "run": "sleb",
     "description": "SLEB-iterative on calibration text: drop the block whose removal hurts least, repeat",
     "label": "SLEB-iterative", "rule_candidates": False, "offered": True, "cli_default": True, "order": 6,
     "units": "any", "calibration": 1024},
]


def sleb(ctx, budget):
    max_tokens = calib_tokens(ctx, "sleb")
    cands, spacing, settings = ctx.literature_candidates("sleb", budget)
    picks: list[int] = []
    steps = []
    for step in range(budget):
        trial = [c for c in cands if c not in picks and all(abs(c - k) > spacing for k in picks)]
        if not trial:
            break
        ppl = {c: ctx.calib_ppl(picks + [c], max_tokens) for c in trial}
        best = min(trial, key=lambda c: (ppl[c], c))
        picks.append(best)
        steps.append({"step": step + 1, "removed": best, "calib_ppl": ppl[best],
                      "trials": {str(c): v for c, v in ppl.items()}})
        if ctx.progress is not None:
            ctx.progress(None, None, f"sleb step {step + 1}: remove {best} (calibration PPL {ppl[best]:.4g})")
    sets = [sorted(picks[:k]) for k in range(1, len(picks) + 1)]
    out = MethodOutput(sets=sets, info={"steps": steps, "calib_base_ppl": ctx.calib_ppl([], max_tokens)},
                       settings=settings | {"calib_tokens": int(ctx.calib_ids(max_tokens).numel()),
                                            "calibration": "corpus prompt region (disjoint from the test text)"})
    if len(picks) < budget:
        out.notes.append(f"SLEB stops after {len(picks)} layers under spacing Δ={spacing}")
    return out
