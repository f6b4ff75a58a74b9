"""Consensus-guided removal (docs/consensus.md): the guided walk over an order that combines the replacement and
interchange layer scores by rank (:mod:`swapkl.scoring.consensus`)."""
from __future__ import annotations

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.selection import check_budget, layer_scores, nested, scan
from swapkl.scoring.consensus import RULES, consensus_order, consensus_scores

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "consensus-mean", "run": "consensus_mean", "needs": ["replacement", "interchange"],
     "description": "consensus-guided: lowest mean of the replacement and interchange ranks first",
     "label": "consensus (rank mean)", "offered": True, "default_in": ["study"], "order": 1.5, "guided": True,
     "style": {"color": "#9467bd", "width": 3.0, "marker": 2}, "cost": "cost_consensus_mean"},
    {"name": "consensus-max", "run": "consensus_max", "needs": ["replacement", "interchange"],
     "description": "consensus-guided, conservative: lowest larger-of-the-two ranks first (safe only if both say so)",
     "label": "consensus (conservative)", "offered": True, "default_in": ["study"], "order": 1.6, "guided": True,
     "style": {"color": "#8c564b", "width": 3.0, "marker": 18}, "cost": "cost_consensus_max"},
]


def consensus_sets(d_repl, d_inter, budget: int, rule: str, spacing: int, candidates, partners=None) -> list[list[int]]:
    """Nested sets for n = 1..budget (fewer when the order stops under the spacing) walking rule ``rule``'s order
    over the layer scores of the two pair matrices (L, L) (nats)."""
    cands = list(candidates)
    check_budget(budget, cands, spacing)
    order = consensus_order(layer_scores(d_repl, partners), layer_scores(d_inter, partners), cands, rule)
    return nested(scan(order, budget, spacing))


def _consensus(ctx, budget: int, rule: str) -> MethodOutput:
    d_r, d_i = ctx.scores["replacement"], ctx.scores["interchange"]
    sets = consensus_sets(d_r, d_i, budget, rule, ctx.spacing, ctx.candidates, ctx.partners)
    c = consensus_scores(layer_scores(d_r, ctx.partners), layer_scores(d_i, ctx.partners), ctx.candidates, rule)
    out = MethodOutput(sets=sets, info={"layer_scores": [None if x != x else float(x) for x in c]},
                       settings={"rule": RULES[rule].name, "spacing": ctx.spacing,
                                 "candidates": list(ctx.candidates), "partners": ctx.partners})
    if len(sets) < budget:
        out.notes.append(f"the consensus order stops after {len(sets)} layers under spacing Δ={ctx.spacing}")
    return out


def _planned(rule: str):
    """Cost: the sets the consensus will pick (known from the scores before any evaluation)."""
    def cost(spec, plan):
        return consensus_sets(plan.scores["replacement"], plan.scores["interchange"], plan.budget, rule,
                              plan.spacing, plan.candidates, getattr(plan, "partners", None))
    return cost


def consensus_mean(ctx, budget):
    return _consensus(ctx, budget, "mean")


def consensus_max(ctx, budget):
    return _consensus(ctx, budget, "max")


cost_consensus_mean = _planned("mean")
cost_consensus_max = _planned("max")
