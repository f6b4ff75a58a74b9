"""Registry of removal methods: a new baseline is one decorated function.

A method is ``func(ctx: MethodContext, budget: int) -> MethodOutput``: it returns nested removal sets
(``sets[k-1]`` is the set for budget k), or, for a seeded method, ``runs = {seed: sets}``.  The curves runner
(:func:`swapkl.removal.removal_curves`) evaluates the sets with its memo; a method that needs to evaluate
trial sets itself (SLEB) uses ``ctx.calib_ppl(removed)`` / ``ctx.test_ppl(removed)``, which share that memo.

Example::

    from swapkl.methods import register, MethodOutput
    from swapkl.removal import nested

    @register("last-first", description="remove the deepest candidates first")
    def last_first(ctx, budget):
        return MethodOutput(sets=nested(sorted(ctx.candidates, reverse=True)[:budget]))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from swapkl.errors import SwapklError


@dataclass
class MethodOutput:
    """``sets``: nested sorted sets for n = 1..len; ``runs``: {seed: sets} for seeded methods; ``info``:
    anything worth keeping (per-layer scores, calibration PPL per step, ...); ``settings``: the parameters used;
    ``notes``: human sentences (e.g. why a curve is shorter than the budget).  ``variant``: None for plain
    removal, or ``{"kind": "merge", "mode": "average" | "laco", "groups": [groups for n = 1, 2, ...]}`` when
    ``sets[k]`` is the set removed by merging ``groups[k]`` (:func:`swapkl.merge.merged_copy`): the runner
    evaluates the merged model, not the pruned one."""

    sets: list = field(default_factory=list)
    runs: dict | None = None
    info: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    variant: dict | None = None


@dataclass
class MethodSpec:
    name: str
    func: Callable
    needs: tuple = ()
    description: str = ""
    rule_candidates: bool = True  # selects from the rule's candidates under its spacing (budget checked up front)


@dataclass
class MethodContext:
    """What a method may use.  ``scores``: {"replacement"/"interchange": (L, L) nats}; ``candidates``/``spacing``/
    ``partners``: the selection rule's parameters; ``corpus``: eval region = test text, prompt region =
    calibration text; ``params``: per-method options ``{method_name: {...}}``."""

    model: object
    tokenizer: object
    scores: dict
    num_layers: int
    candidates: list
    spacing: int
    partners: object
    corpus: object
    evaluator: object
    seeds: list
    memo: object
    batch_size: int | None = None
    should_stop: Callable | None = None
    progress: Callable | None = None
    params: dict = field(default_factory=dict)
    _calib_ids: object = None

    def param(self, method: str, key: str, default):
        return self.params.get(method, {}).get(key, default)

    def literature_candidates(self, method: str, budget: int) -> tuple[list, int, dict]:
        """(candidates, spacing, settings) for a literature baseline (BI, CKA, SLEB): every layer and no spacing
        rule by default, the guided methods' candidates and spacing with ``params[method]["constrained"]``.
        Raises :class:`~swapkl.removal.BudgetError` when ``budget`` does not fit."""
        from swapkl.removal import check_budget

        constrained = bool(self.param(method, "constrained", False))
        cands = list(self.candidates) if constrained else list(range(self.num_layers))
        spacing = self.spacing if constrained else 0
        check_budget(budget, cands if constrained else cands[:-1], spacing)  # keep at least one layer
        return cands, spacing, {"constrained": constrained, "spacing": spacing, "candidates": cands}

    def calib_ids(self, max_tokens: int = 2048):
        """Calibration token ids (1-D LongTensor): the start of the corpus's prompt region (disjoint from the
        evaluation text), at most ``max_tokens`` tokens."""
        import torch

        if self._calib_ids is None or self._calib_ids.numel() < max_tokens:
            words = self.corpus.prompt_text().split()
            if not words:
                raise SwapklError(f"corpus '{self.corpus.name}' has no calibration text after its evaluation region")
            text = " ".join(words[: max_tokens])  # a word is at least one token
            ids = torch.as_tensor(self.tokenizer(text)["input_ids"], dtype=torch.long).reshape(-1)
            self._calib_ids = ids
        return self._calib_ids[:max_tokens]

    def calib_ppl(self, removed: Sequence[int], max_tokens: int = 2048, window: int | None = None) -> float:
        """PPL of the model without ``removed`` on the calibration text (non-overlapping windows), memoised."""
        from swapkl import evaluate as E
        from swapkl.prune import pruned_copy

        ids = self.calib_ids(max_tokens)
        win = min(window or self.evaluator.window, ids.numel())
        key = f"calib:{getattr(self.corpus, 'sha256', '?')}:{ids.numel()}:{win}"
        if self.should_stop is not None and self.should_stop():
            from swapkl.errors import ComputeInterrupted
            raise ComputeInterrupted("stopped")
        res = self.memo.get(key, removed, lambda: E.evaluate_ppl(
            pruned_copy(self.model, removed) if removed else self.model, ids, win, win,
            batch_size=self.batch_size))
        return res.ppl


_REGISTRY: dict[str, MethodSpec] = {}
GROUPS: dict[str, tuple[str, ...]] = {}


def register(name: str, needs: Sequence[str] = (), description: str = "", group: str | None = None,
             rule_candidates: bool = True):
    """Decorator: register ``func(ctx, budget) -> MethodOutput`` under ``name``.  ``needs``: score matrices the
    method requires (``"replacement"``, ``"interchange"``).  ``group``: an alias that expands to every member
    whose needs are met (``"anti"`` → anti-replacement, anti-interchange).  ``rule_candidates=False``: the
    method chooses its own candidates (literature baselines), so the runner does not check the budget against the
    selection rule before running it."""

    def deco(func):
        _REGISTRY[name] = MethodSpec(name, func, tuple(needs), description or (func.__doc__ or "").strip(),
                                     rule_candidates)
        if group:
            GROUPS[group] = tuple(dict.fromkeys(GROUPS.get(group, ()) + (name,)))
        return func
    return deco


def available() -> list[str]:
    return sorted(_REGISTRY) + sorted(g for g in GROUPS if g not in _REGISTRY)


def get(name: str) -> MethodSpec:
    """The method registered as ``name``; raises ``SwapklError("unknown method X; available: ...")``."""
    if name not in _REGISTRY:
        raise SwapklError(f"unknown method {name}; available: {', '.join(available())}")
    return _REGISTRY[name]


def resolve(names: Sequence[str], scores: dict | None = None) -> list[MethodSpec]:
    """Method names (and group aliases) → specs, in order, without duplicates.  A group keeps the members whose
    score needs are met; an explicitly named method with unmet needs raises."""
    scores = scores or {}
    out: list[MethodSpec] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        if name in GROUPS and name not in _REGISTRY:
            members = [get(m) for m in GROUPS[name]]
            ok = [m for m in members if all(n in scores for n in m.needs)]
            if not ok:
                raise SwapklError(f"method group '{name}' needs scores ({', '.join(sorted({n for m in members for n in m.needs}))}); none were given")
            specs = ok
        else:
            spec = get(name)
            missing = [n for n in spec.needs if n not in scores]
            if missing:
                raise SwapklError(f"method '{name}' needs {', '.join(missing)} scores; none were given")
            specs = [spec]
        for s in specs:
            if s not in out:
                out.append(s)
    return out


from swapkl.methods import guided as _guided  # noqa: E402,F401  (registers replacement, interchange, anti-*)
from swapkl.methods import random as _random  # noqa: E402,F401
from swapkl.methods import bi as _bi  # noqa: E402,F401
from swapkl.methods import sleb as _sleb  # noqa: E402,F401
from swapkl.methods import taylor as _taylor  # noqa: E402,F401
from swapkl.methods import laco as _laco  # noqa: E402,F401
from swapkl import recommend as _recommend  # noqa: E402,F401  (registers "recommend")
