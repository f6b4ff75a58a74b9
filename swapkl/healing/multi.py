"""Heal the set each method chooses at each n with ONE recipe and ONE control, on the same evaluation windows
(:func:`heal_curves`), and compare two methods' healed models at each n, paired over those windows
(:class:`swapkl.healing.curves.HealCurves`; docs/healing.md).

The control (the unpruned base fine-tuned with the recipe) trains once: every heal of the run shares one
:func:`~swapkl.healing.heal.heal` session (training text, weights fingerprint, evaluation memo, adapters), and with
the disk cache the adapter is also found by later runs.  Two methods that choose the same set at some n share one
heal (it is computed once and its paired difference is exactly 0).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from swapkl.errors import SwapklError
from swapkl.healing.curves import HealCurves, set_key
from swapkl.healing.recipe import Recipe
from swapkl.removal.plan import RemovalPlan, RunHooks

# Deferred: swapkl.healing.heal (torch, peft) is imported by heal_curves.

#: bound on the heals of one run (methods × n)
MAX_SETS = 64
#: methods whose sets are merges, not removals: healing takes plain removal (chosen_set refuses them)
MERGING = ("laco",)


def parse_ns(text, limit: int | None = None) -> list[int]:
    """``"1-4"``, ``"2,4"`` or ``"1..3"`` (or a list of ints) -> sorted distinct n >= 1; one-line error otherwise."""
    if isinstance(text, (list, tuple)):
        parts = [str(x) for x in text]
    else:
        parts = [p for p in str(text).replace(" ", "").split(",") if p]
    out: set[int] = set()
    try:
        for p in parts:
            lo, sep, hi = p.replace("..", "-").partition("-")
            a, b = int(lo), int(hi) if sep else int(lo)
            if b - a > 1000:
                raise ValueError
            out.update(range(a, b + 1))
    except ValueError:
        raise SwapklError(f"n wants numbers such as 1-4 or 2,4 (got '{text}')") from None
    if not out or min(out) < 1:
        raise SwapklError(f"n must be at least 1 (got '{text}')")
    if limit is not None and max(out) > limit:
        raise SwapklError(f"n goes up to {limit} here (got {max(out)})")
    return sorted(out)


def heal_curves(model, tokenizer, scores: dict | None, plan: RemovalPlan, ns: Sequence[int], recipe: Recipe,
                setup=None, hooks: RunHooks | None = None, *, pair: Sequence[str] | None = None,
                shared: dict | None = None) -> HealCurves:
    """Heal, for each method of ``plan`` and each n in ``ns`` (within 1..``plan.budget``), the set that method chooses
    (:func:`~swapkl.healing.heal.chosen_set`, with ``scores`` for the guided methods and ``plan.spacing``), with
    ``recipe`` against one control, on the texts of ``setup`` (a :class:`~swapkl.healing.heal.HealSetup`; its
    evaluator is the plan's; its ``heldout`` text gives every point a held-out measurement; its ``repair``, or else
    the plan's ``repair`` / ``bridge``, starts each heal from the bridged model), and compare ``pair`` (default: interchange vs replacement when both are asked) at each
    n.  ``hooks.progress(done, total, message)`` counts training updates and evaluations over the whole run;
    ``hooks.on_partial(HealCurves)`` after each heal; ``hooks.should_stop()`` →
    :class:`~swapkl.errors.ComputeInterrupted` (the heals done so far are cached).  ``shared``: a dict that receives
    the heals' shared session (``shared["adapters"]``: every trained adapter, for
    :func:`swapkl.healing.tasks.heal_task_accuracy`)."""
    from swapkl.healing.heal import HealSetup, chosen_set, heal
    from swapkl.removal.curves import plan_evaluator
    from swapkl.measure.memo import EvalMemo, disk_memo
    from swapkl.scoring.corpora import load_corpus

    t0 = time.perf_counter()
    hooks = hooks if hooks is not None else RunHooks()
    recipe.validate()
    methods, ns = list(plan.methods), sorted(set(int(n) for n in ns))
    if not ns or ns[0] < 1 or ns[-1] > plan.budget:
        raise SwapklError(f"healed curves need n within 1..{plan.budget} (got {ns})")
    if len(methods) * len(ns) > MAX_SETS:
        raise SwapklError(f"at most {MAX_SETS} heals in one run (methods × n); got {len(methods) * len(ns)}")
    if pair is not None and (len(pair) != 2 or any(m not in methods for m in pair)):
        raise SwapklError(f"the compared pair must be two of the healed methods ({', '.join(methods)})")
    setup = dataclasses.replace(setup or HealSetup(), evaluator=plan_evaluator(plan))
    if setup.corpus is None:
        setup = dataclasses.replace(setup, corpus=load_corpus())
    memo = disk_memo(setup.identity, kl=False) if setup.use_cache else EvalMemo()
    shared = shared if shared is not None else {}
    shared["memo"] = memo
    chosen = [(m, n, *chosen_set(model, tokenizer, m, n, scores, plan, setup.corpus, memo=memo,
                                 hooks=RunHooks(should_stop=hooks.should_stop, contract=hooks.contract)))
              for m in methods for n in ns]
    unique = list(dict.fromkeys(set_key(rem) for _, _, rem, _ in chosen))
    per = 2 * recipe.steps + (4 + (plan.repair == "bridge")) * (1 + (setup.heldout is not None))
    total = per * len(unique)
    heals, done_sets = [], {}
    for m, n, removed, sel in chosen:
        k = set_key(removed)
        if k not in done_sets:
            base = per * len(done_sets)

            def prog(d, _t, msg, base=base, m=m, n=n):
                if hooks.progress is not None:
                    hooks.progress(base + d, total, f"{m} n={n}: {msg}")

            done_sets[k] = heal(model, tokenizer, removed, recipe, setup,
                                RunHooks(progress=prog, should_stop=hooks.should_stop), plan=plan, selection=sel,
                                shared=shared)
        h = done_sets[k].to_dict()
        heals.append((m, n, dict(h, selection=sel)))
        if hooks.on_partial is not None:
            hooks.on_partial(HealCurves.from_heals(heals, pair=pair, seconds=time.perf_counter() - t0))
    notes = [f"methods {a} and {b} choose the same set at n = {n}: one heal" for a, b, n in _shared_sets(chosen)]
    if hooks.progress is not None:
        hooks.progress(total, total, "healed curves finished")
    return HealCurves.from_heals(heals, pair=pair, seconds=time.perf_counter() - t0, notes=notes)


def _shared_sets(plan) -> list[tuple[str, str, int]]:
    out = []
    for i, (m, n, rem, _) in enumerate(plan):
        for m2, n2, rem2, _ in plan[i + 1:]:
            if n2 == n and m2 != m and set_key(rem2) == set_key(rem):
                out.append((m, m2, n))
    return out
