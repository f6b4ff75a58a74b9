"""Swap-KL-guided removal (docs/method.md §4) and the anti-guided baseline (docs/method.md §5)."""
from __future__ import annotations

from swapkl.removal.methods import MethodOutput, register
from swapkl.removal.selection import layer_scores, select


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


@register("replacement", needs=("replacement",), description="replacement-guided: lowest min-partner d_repl first",
          label="replacement-guided", offered=True, default=True, cli_default=True, order=0, guided=True,
          style={"color": "#1f77b4", "width": 3.5, "marker": 11}, cost=_planned("replacement", False))
def replacement(ctx, budget):
    return _guided(ctx, budget, "replacement", anti=False)


@register("interchange", needs=("interchange",), description="interchange-guided: lowest min-partner d_inter first",
          label="interchange-guided", offered=True, default=True, cli_default=True, order=1, guided=True,
          style={"color": "#d62728", "width": 3.5, "marker": 7}, cost=_planned("interchange", False))
def interchange(ctx, budget):
    return _guided(ctx, budget, "interchange", anti=False)


@register("anti-replacement", needs=("replacement",), group="anti",
          description="anti-guided on d_repl: highest layer score first", offered=True, order=3,
          cost=_planned("replacement", True))
def anti_replacement(ctx, budget):
    return _guided(ctx, budget, "replacement", anti=True)


@register("anti-interchange", needs=("interchange",), group="anti",
          description="anti-guided on d_inter: highest layer score first", offered=True, order=4,
          cost=_planned("interchange", True))
def anti_interchange(ctx, budget):
    return _guided(ctx, budget, "interchange", anti=True)
