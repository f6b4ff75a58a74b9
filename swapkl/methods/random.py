"""Random removal under the same candidates and spacing rule (METHOD §5), one nested curve per seed."""
from __future__ import annotations

from swapkl.errors import SwapklError
from swapkl.methods import MethodOutput, register
from swapkl.removal import random_sets

MIN_SEEDS = 5


@register("random", description="uniform random layers under the spacing rule; mean and spread over >= 5 seeds")
def random_removal(ctx, budget):
    seeds = list(ctx.param("random", "seeds", ctx.seeds))
    if len(seeds) < MIN_SEEDS:
        raise SwapklError(f"random removal needs at least {MIN_SEEDS} seeds (got {len(seeds)})")
    runs = {int(s): random_sets(ctx.candidates, budget, ctx.spacing, seed=int(s)) for s in seeds}
    return MethodOutput(runs=runs, settings={"seeds": seeds, "spacing": ctx.spacing,
                                             "candidates": list(ctx.candidates),
                                             "sampler": "sequential uniform over candidates that keep the budget "
                                                        "feasible"})
