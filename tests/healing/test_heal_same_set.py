"""A heal chooses its set from the plan the curves ran: ``heal --method M --n k`` (:func:`swapkl.healing.heal.chosen_set`)
heals exactly the set ``curves`` shows for M at k under the same plan, with non-default candidates, boundary and
partners (one constructor, :meth:`swapkl.removal.plan.CheckedPlan.context`, makes every run's method context)."""
from __future__ import annotations

import numpy as np

from swapkl.healing.heal import chosen_set
from swapkl.removal.curves import removal_curves
from swapkl.measure.evaluate import Evaluator
from swapkl.measure.memo import EvalMemo
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.removal.selection import default_candidates

EV = Evaluator("tiny", 300, 128, 64)


def _scores(L):
    """Interchange cheapest at the boundary (layer 0) and at layer 3, replacement at the last layer and at 1: a run
    that keeps the boundary and names its own candidates chooses other sets than the default rule."""
    def one(order):
        d = np.full((L, L), 2.0)
        np.fill_diagonal(d, np.nan)
        for rank, k in enumerate(order):
            for j in (k - 1, k + 1):
                if 0 <= j < L:
                    d[k, j] = d[j, k] = min(d[k, j], 0.1 * (rank + 1))
        return d
    return {"interchange": one([0, 3]), "replacement": one([L - 1, 1])}


def test_heal_heals_the_set_curves_show_under_the_same_plan(stories, small_corpus):
    L = stories.num_layers
    scores = _scores(L)
    plan = RemovalPlan(budget=2, methods=("interchange", "replacement"), candidates=(0, 1, 3, L - 1),
                       exclude_boundary=False, partners=1, spacing=1, evaluator=EV)
    assert list(plan.candidates) != default_candidates(L) and plan.partners == 1 and not plan.exclude_boundary
    memo = EvalMemo()
    curves = removal_curves(stories.model, stories.tokenizer, scores, plan, RunHooks(corpus=small_corpus, memo=memo))
    for m in plan.methods:
        for n in (1, 2):
            shown = next(e["removed"] for e in curves.methods[m] if e["n"] == n)
            healed, sel = chosen_set(stories.model, stories.tokenizer, m, n, scores, plan, small_corpus, memo=memo)
            assert healed == shown and sel["method"] == m and sel["n"] == n
    # the plan mattered: the boundary layer the default rule excludes is in a chosen set
    assert any(0 in e["removed"] or L - 1 in e["removed"] for es in curves.methods.values() for e in es)
