"""Swap-KL-guided removal (METHOD §4) and the anti-guided baseline (METHOD §5)."""
from __future__ import annotations

from swapkl.methods import MethodOutput, register
from swapkl.removal import layer_scores, select


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


@register("replacement", needs=("replacement",), description="replacement-guided: lowest min-partner d_repl first")
def replacement(ctx, budget):
    return _guided(ctx, budget, "replacement", anti=False)


@register("interchange", needs=("interchange",), description="interchange-guided: lowest min-partner d_inter first")
def interchange(ctx, budget):
    return _guided(ctx, budget, "interchange", anti=False)


@register("anti-replacement", needs=("replacement",), group="anti",
          description="anti-guided on d_repl: highest layer score first")
def anti_replacement(ctx, budget):
    return _guided(ctx, budget, "replacement", anti=True)


@register("anti-interchange", needs=("interchange",), group="anti",
          description="anti-guided on d_inter: highest layer score first")
def anti_interchange(ctx, budget):
    return _guided(ctx, budget, "interchange", anti=True)
