"""Swap-KL-guided removal (docs/method.md §4) and the anti-guided baseline (docs/method.md §5)."""
from __future__ import annotations

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.selection import layer_scores, select

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "replacement", "run": "replacement", "needs": ["replacement"],
     "description": "replacement-guided: lowest min-partner d_repl first", "label": "replacement-guided",
     "offered": True, "default": True, "cli_default": True, "default_in": ["study", "tasks"], "order": 0,
     "guided": True, "units": "any",
     "style": {"color": "#1f77b4", "width": 3.5, "marker": 11}, "cost": "cost_replacement"},
    {"name": "interchange", "run": "interchange", "needs": ["interchange"],
     "description": "interchange-guided: lowest min-partner d_inter first", "label": "interchange-guided",
     "offered": True, "default": True, "cli_default": True, "default_in": ["study", "tasks"], "order": 1,
     "guided": True, "units": "any",
     "style": {"color": "#d62728", "width": 3.5, "marker": 7}, "cost": "cost_interchange"},
    {"name": "anti-replacement", "run": "anti_replacement", "needs": ["replacement"], "group": "anti",
     "description": "anti-guided on d_repl: highest layer score first", "offered": True, "order": 3, "units": "any",
     "cost": "cost_anti_replacement"},
    {"name": "anti-interchange", "run": "anti_interchange", "needs": ["interchange"], "group": "anti",
     "description": "anti-guided on d_inter: highest layer score first", "offered": True, "order": 4, "units": "any",
     "cost": "cost_anti_interchange"},
]


def _guided(ctx, budget: int, protocol: str, anti: bool) -> MethodOutput:
    d = ctx.scores[protocol]
    sets = select(d, budget, spacing=ctx.spacing, candidates=ctx.candidates, anti=anti, partners=ctx.partners,
                  strict=False)
    s = layer_scores(d, ctx.partners)
    out = MethodOutput(sets=sets, info={"layer_scores": [None if x != x else float(x) for x in s]},
                       settings={"protocol": protocol, "anti": anti, "spacing": ctx.spacing,
                                 "candidates": list(ctx.candidates), "partners": ctx.partners})
    if len(sets) < budget:
        out.notes.append(f"the score order stops after {len(sets)} layers under spacing Δ={ctx.spacing}")
    return out


def _planned(protocol: str, anti: bool):
    """Cost: the sets the guided rule will pick (known from the scores before any evaluation)."""
    def cost(spec, plan):
        return select(plan.scores[protocol], plan.budget, spacing=plan.spacing, candidates=plan.candidates,
                      anti=anti, strict=False)
    return cost


def replacement(ctx, budget):
    return _guided(ctx, budget, "replacement", anti=False)


def interchange(ctx, budget):
    return _guided(ctx, budget, "interchange", anti=False)


def anti_replacement(ctx, budget):
    return _guided(ctx, budget, "replacement", anti=True)


def anti_interchange(ctx, budget):
    return _guided(ctx, budget, "interchange", anti=True)


# the costs named in METHODS: the sets each rule will pick
cost_replacement = _planned("replacement", False)
cost_interchange = _planned("interchange", False)
cost_anti_replacement = _planned("replacement", True)
cost_anti_interchange = _planned("interchange", True)
