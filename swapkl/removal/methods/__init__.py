"""Registry of removal methods, the one place that knows them: a new baseline is one file in this package.

Every module of ``swapkl/removal/methods/`` is imported when the package is (:func:`discover`, via ``pkgutil``), so a
file that defines a decorated function is all a new method needs: its spec carries the label shown in legends
and tables, whether it is seeded and how many runs it averages, whether the dashboard offers it and selects it
by default, whether the ``curves`` command runs it by default, its display style and what it costs in
perplexity evaluations.  The curves runner, the dashboard, the CLI and the plots ask this registry.

A method is ``func(ctx: MethodContext, budget: int) -> MethodOutput``: it returns nested removal sets
(``sets[k-1]`` is the set for budget k), or, for a seeded method, ``runs = {seed: sets}``.  The curves runner
(:func:`swapkl.removal.curves.removal_curves`) evaluates the sets with its memo; a method that needs to evaluate
trial sets itself (SLEB) uses ``ctx.calib_ppl(removed)`` / ``ctx.test_ppl(removed)``, which share that memo.

Method modules must not import torch at module level (the dashboard's first paint and ``swapkl --help``
import this package); import it inside the functions that compute.

Example (``swapkl/removal/methods/last_first.py``)::

    from swapkl.removal.methods import register, MethodOutput
    from swapkl.removal.selection import nested

    @register("last-first", description="remove the deepest candidates first", label="deepest first")
    def last_first(ctx, budget):
        return MethodOutput(sets=nested(sorted(ctx.candidates, reverse=True)[:budget]))
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.removal.selection import check_budget

#: how many seeds a seeded method runs unless its spec says otherwise (the paper's random baseline: 5)
DEFAULT_RUNS = 5


@dataclass
class MethodOutput:
    """``sets``: nested sorted sets for n = 1..len; ``runs``: {seed: sets} for seeded methods; ``info``:
    anything worth keeping (per-layer scores, calibration PPL per step, ...); ``settings``: the parameters used;
    ``notes``: human sentences (e.g. why a curve is shorter than the budget).  ``variant``: None for plain
    removal, or ``{"kind": "merge", "mode": "average" | "laco", "groups": [groups for n = 1, 2, ...]}`` when
    ``sets[k]`` is the set removed by merging ``groups[k]`` (:func:`swapkl.surgery.merge.merged_copy`): the runner
    evaluates the merged model, not the pruned one."""

    sets: list = field(default_factory=list)
    runs: dict | None = None
    info: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    variant: dict | None = None


@dataclass
class EvalPlan:
    """What a method's cost function may look at: the run's budget, layer count, score matrices, the selection
    rule's candidates and spacing, and the seeds a seeded method runs."""

    budget: int
    num_layers: int
    scores: dict = field(default_factory=dict)
    candidates: list | None = None
    spacing: int = 1
    seeds: list = field(default_factory=lambda: list(range(DEFAULT_RUNS)))


def _cost_per_point(spec: MethodSpec, plan: EvalPlan) -> int:
    """Default cost: one evaluation per curve point (per seed for a seeded method)."""
    return plan.budget * (len(plan.seeds) if spec.seeded else 1)


@dataclass
class MethodSpec:
    """A registered method.  ``label``: its name in legends and tables; ``runs``: seeds averaged (0 =
    deterministic); ``offered``/``default``: shown / preselected in the dashboard; ``cli_default``: run by
    ``swapkl curves`` without ``--methods``; ``order``: display order (lower first); ``style``: plotly line
    style for its curve (``color``, ``width``, ``dash``, ``marker`` size; None = a thin dotted baseline colour);
    ``guided``: a swap-KL-guided method (drawn thick, run and listed first); ``cost(spec, plan)``: evaluations
    the method needs -- an int, or the removal sets it will evaluate (deduplicated across methods)."""

    name: str
    func: Callable
    needs: tuple = ()
    description: str = ""
    rule_candidates: bool = True  # selects from the rule's candidates under its spacing (budget checked up front)
    label: str = ""
    runs: int = 0
    offered: bool = False
    default: bool = False
    cli_default: bool = False
    order: int = 100
    style: dict | None = None
    guided: bool = False
    cost: Callable = _cost_per_point

    @property
    def seeded(self) -> bool:
        return self.runs > 0

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, MethodSpec) and other.name == self.name


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
        Raises :class:`~swapkl.removal.selection.BudgetError` when ``budget`` does not fit."""
        constrained = bool(self.param(method, "constrained", False))
        cands = list(self.candidates) if constrained else list(range(self.num_layers))
        spacing = self.spacing if constrained else 0
        check_budget(budget, cands if constrained else cands[:-1], spacing)  # keep at least one layer
        return cands, spacing, {"constrained": constrained, "spacing": spacing, "candidates": cands}

    def calib_ids(self, max_tokens: int = 2048):
        """Calibration token ids (1-D LongTensor): the start of the corpus's prompt region (disjoint from the
        evaluation text), at most ``max_tokens`` tokens."""
        import torch  # deferred: importing the registry (dashboard, --help) must not load torch

        if self._calib_ids is None or self._calib_ids.numel() < max_tokens:
            words = self.corpus.prompt_text().split()
            if not words:
                raise SwapklError(f"corpus '{self.corpus.name}' has no calibration text after its evaluation region")
            text = " ".join(words[: max_tokens])  # a word is at least one token
            ids = torch.as_tensor(self.tokenizer(text)["input_ids"], dtype=torch.long).reshape(-1)
            self._calib_ids = ids
        return self._calib_ids[:max_tokens]

    def calib_ppl(self, removed: Sequence[int], max_tokens: int = 2048, window: int | None = None,
                  stride: int | None = None) -> float:
        """PPL of the model without ``removed`` on the calibration text, memoised.  ``window`` (tokens, default
        the evaluator's) and ``stride`` (default = ``window``: non-overlapping windows, SLEB's convention; the
        evaluator's stride scores every token with the held-out evaluator's context)."""
        from swapkl.removal import evaluate as E  # deferred (torch), as above
        from swapkl.surgery.prune import pruned_copy

        ids = self.calib_ids(max_tokens)
        win = min(window or self.evaluator.window, ids.numel())
        step = min(stride or win, win)
        key = f"calib:{getattr(self.corpus, 'sha256', '?')}:{ids.numel()}:{win}" + (f":s{step}" if step != win else "")
        if self.should_stop is not None and self.should_stop():
            raise ComputeInterrupted("stopped")
        res = self.memo.get(key, removed, lambda: E.evaluate_ppl(
            pruned_copy(self.model, removed) if removed else self.model, ids, win, step,
            batch_size=self.batch_size))
        return res.ppl


_REGISTRY: dict[str, MethodSpec] = {}
GROUPS: dict[str, tuple[str, ...]] = {}


def register(name: str, needs: Sequence[str] = (), description: str = "", group: str | None = None,
             rule_candidates: bool = True, *, label: str | None = None, runs: int = 0, offered: bool = False,
             default: bool = False, cli_default: bool = False, order: int = 100, style: dict | None = None,
             guided: bool = False, cost: Callable | None = None):
    """Decorator: register ``func(ctx, budget) -> MethodOutput`` under ``name``.  ``needs``: score matrices the
    method requires (``"replacement"``, ``"interchange"``).  ``group``: an alias that expands to every member
    whose needs are met (``"anti"`` → anti-replacement, anti-interchange).  ``rule_candidates=False``: the
    method chooses its own candidates (literature baselines), so the runner does not check the budget against the
    selection rule before running it.  The keyword-only arguments fill :class:`MethodSpec` (label defaults to the
    name; a method is not offered in the dashboard nor run by default unless it says so)."""

    def deco(func):
        spec = MethodSpec(name, func, tuple(needs), description or (func.__doc__ or "").strip(), rule_candidates,
                          label=label or name, runs=int(runs), offered=offered, default=default,
                          cli_default=cli_default, order=order, style=style, guided=guided,
                          cost=cost or _cost_per_point)
        _REGISTRY[name] = spec
        if group:
            GROUPS[group] = tuple(dict.fromkeys(GROUPS.get(group, ()) + (name,)))
        return func
    return deco


def specs() -> list[MethodSpec]:
    """Every registered method in display order (``order``, then name)."""
    return sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))


def find(name: str) -> MethodSpec | None:
    """The spec of ``name``, or None (a curves file may name a method this installation does not know)."""
    return _REGISTRY.get(name)


def label(name: str) -> str:
    """The legend / table label of method ``name`` (the name itself for an unknown method)."""
    spec = _REGISTRY.get(name)
    return spec.label if spec is not None else name


def offered() -> tuple[str, ...]:
    """The methods the dashboard offers, in display order."""
    return tuple(s.name for s in specs() if s.offered)


def default_set(kind: str = "dashboard") -> tuple[str, ...]:
    """The methods run when none are named: ``"dashboard"`` (the dashboard's preselection, also ``report``'s
    default) or ``"cli"`` (``swapkl curves``), in display order."""
    if kind not in ("dashboard", "cli"):
        raise SwapklError(f"unknown default method set {kind!r} (dashboard, cli)")
    return tuple(s.name for s in specs() if (s.default if kind == "dashboard" else s.cli_default))


def run_order(names: Iterable[str]) -> list[str]:
    """``names`` with the guided methods first (their curves and the verdict come first), otherwise as given."""
    names = list(names)
    first = [n for n in names if (s := _REGISTRY.get(n)) is not None and s.guided]
    first.sort(key=lambda n: _REGISTRY[n].order)
    return first + [n for n in names if n not in first]


def default_seeds(chosen: Sequence[MethodSpec] = ()) -> list[int]:
    """Seeds a run uses when none are given: as many as the most-seeded chosen method runs."""
    return list(range(max([s.runs for s in chosen if s.seeded] or [DEFAULT_RUNS])))


def expected_evaluations(names: Sequence[str], plan: EvalPlan) -> int:
    """Distinct perplexity evaluations the curves of ``names`` will need under ``plan``, baseline included (an
    estimate for methods whose sets depend on evaluations, e.g. SLEB; a method whose sets cannot be planned
    counts ``budget``)."""
    sets: set = set()
    extra = 0
    for name in names:
        spec = _REGISTRY.get(name)
        try:
            c = spec.cost(spec, plan) if spec is not None else plan.budget
        except SwapklError:
            c = plan.budget
        if isinstance(c, int):
            extra += c
        else:
            sets.update(frozenset(s) for s in c)
    return 1 + len(sets) + extra


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


def discover(*folders) -> list[str]:
    """Import every module of this package (each registers its methods); returns the module names.  Runs when
    the package is imported.  ``folders``: more folders of method modules (a plugin directory, a test's temporary
    one), added to ``swapkl.removal.methods.__path__`` first; their modules import as ``swapkl.removal.methods.<name>``."""
    for folder in folders:
        if str(folder) not in __path__:
            __path__.append(str(folder))
    names = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
            names.append(info.name)
    return names

discover()
