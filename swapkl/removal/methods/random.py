"""Random removal under the same candidates and spacing rule (docs/method.md §5), one nested curve per seed."""
from __future__ import annotations

from swapkl.errors import SwapklError
from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.selection import default_candidates, random_sets

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "random", "run": "random_removal",
     "description": "uniform random layers under the spacing rule; mean and spread over >= 5 seeds",
     "label": "random", "runs": 5, "offered": True, "default": True, "cli_default": True,
     "default_in": ["study", "tasks"], "order": 2, "units": "any", "variants": ["runs"],
     "style": {"color": "#7f7f7f", "width": 1.5, "dash": "dash"}, "cost": "_planned"},
]


MIN_SEEDS = METHODS[0]["runs"]  # the paper's random baseline: at least 5 seeds


def _planned(spec, plan):
    """Cost: every seed's sets (drawn without evaluating anything)."""
    cands = plan.candidates if plan.candidates is not None else default_candidates(plan.num_layers)
    return [s for seed in plan.seeds for s in random_sets(cands, plan.budget, plan.spacing, seed=seed)]


def random_removal(ctx, budget):
    seeds = list(ctx.param("random", "seeds", ctx.seeds))
    if len(seeds) < MIN_SEEDS:
        raise SwapklError(f"random removal needs at least {MIN_SEEDS} seeds (got {len(seeds)})")
    runs = {int(s): random_sets(ctx.candidates, budget, ctx.spacing, seed=int(s)) for s in seeds}
    return MethodOutput(runs=runs, settings={"seeds": seeds, "spacing": ctx.spacing,
                                             "candidates": list(ctx.candidates),
                                             "sampler": "sequential uniform over candidates that keep the budget "
                                                        "feasible"})
