"""The interface of a removal method: what it is given (:class:`MethodContext`), what it returns
(:class:`MethodOutput`), how it is described (:class:`MethodSpec`) and what its cost function sees (:class:`EvalPlan`).

A method is ``func(ctx: MethodContext, budget: int) -> MethodOutput``.  What it returns is one of the
:data:`VARIANTS` its spec declares (:attr:`MethodSpec.variants`):

* ``"sets"``: removal sets, ``sets[k-1]`` the set of layer indices removed at budget k (nested for most methods;
  angular distance and the recommendation choose each budget's set afresh);
* ``"runs"``: a seeded method's ``runs = {seed: sets}``, one curve per seed (``sets`` empty), averaged by the runner;
* ``"merge"``: ``sets`` plus ``variant = {"kind": "merge", "mode": "average" | "laco", "groups": [...]}``:
  ``sets[k]`` is removed by merging each group of ``groups[k]`` into its lowest slot (LaCo);
* ``"units"``: ``sets`` (the whole blocks of each set) plus ``variant = {"kind": "units", "sets": [...]}``: mixed
  attention / MLP sublayer units as codes ``2·layer + (0 attention | 1 mlp)`` (the best mix).

The curves runner (:func:`swapkl.removal.curves.removal_curves`) evaluates the sets with its memo; a method that
needs to evaluate trial sets itself (SLEB) uses ``ctx.calib_ppl(removed)``, which shares that memo.  A method
that reads calibration text declares its default token count (:attr:`MethodSpec.calibration`) and takes the
count a run asks for from ``ctx.params[name]["calib_tokens"]`` (:func:`swapkl.removal.methods.calibration_params`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

from swapkl.contract import BLOCK
from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.removal.selection import check_budget


def load(target: Callable | str) -> Callable:
    """``target`` itself, or the object a ``"module:object"`` string names (its module imported now)."""
    if not isinstance(target, str):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


#: how many seeds a seeded method runs unless its spec says otherwise (the paper's random baseline: 5)
DEFAULT_RUNS = 5
#: what a method may return (module docstring): plain removal sets, seeded runs, merges, mixed sublayer units
VARIANTS = ("sets", "runs", "merge", "units")


@dataclass
class MethodOutput:
    """``sets``: nested sorted sets for n = 1..len; ``runs``: {seed: sets} for seeded methods; ``info``:
    anything worth keeping (per-layer scores, calibration PPL per step, ...); ``settings``: the parameters used;
    ``notes``: human sentences (e.g. why a curve is shorter than the budget).  ``variant``: None for plain
    removal and seeded runs; ``{"kind": "merge", "mode": "average" | "laco", "groups": [groups for n = 1, 2, ...]}``
    when ``sets[k]`` is the set removed by merging ``groups[k]`` (:func:`swapkl.surgery.merge.merged_copy`: the
    runner evaluates the merged model, not the pruned one); ``{"kind": "units", "sets": [codes for n = 1, 2, ...]}``
    when ``sets[k]`` stands for the mixed sublayer set ``variant["sets"][k]`` (codes ``2·layer + (0 attention | 1
    mlp)``; the runner skips those sublayers).  The module docstring lists the variants."""

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


def cost_per_point(spec: MethodSpec, plan: EvalPlan) -> int:
    """Default cost: one evaluation per curve point (per seed for a seeded method)."""
    return plan.budget * (len(plan.seeds) if spec.seeded else 1)


@dataclass
class MethodSpec:
    """A registered method.  ``target``: the function, or where it is as ``"module:object"`` (imported on first
    use, :attr:`func`); ``label``: its name in legends and tables; ``runs``: seeds averaged (0 = deterministic);
    ``offered``/``default``: shown / preselected in the dashboard; ``cli_default``: run by ``swapkl curves``
    without ``--methods``; ``default_in``: the other default sets it belongs to
    (:data:`~swapkl.removal.methods.registry.DEFAULT_SETS`: ``"study"``, ``"tasks"``); ``order``: display order
    (lower first); ``style``: plotly line style for its curve (``color``, ``width``, ``dash``, ``marker`` size;
    None = a thin dotted baseline colour); ``guided``: a swap-KL-guided method (drawn thick, run and listed first);
    ``cost_target``: ``cost(spec, plan)``, the evaluations the method needs -- an int, or the removal sets it will
    evaluate (deduplicated across methods); a callable or ``"module:object"``, None for one evaluation per curve
    point.

    Capabilities, as data: ``units``: the units of analysis it removes (:data:`swapkl.contract.UNITS`; whole blocks
    unless it says otherwise); ``variants``: what it returns (:data:`VARIANTS`); ``calibration``: the calibration
    tokens it reads by default (None: it reads no calibration text)."""

    name: str
    target: Callable | str
    needs: tuple = ()
    description: str = ""
    rule_candidates: bool = True  # selects from the rule's candidates under its spacing (budget checked up front)
    label: str = ""
    runs: int = 0
    offered: bool = False
    default: bool = False
    cli_default: bool = False
    default_in: tuple = ()
    order: int = 100
    style: dict | None = None
    guided: bool = False
    cost_target: Callable | str | None = None
    units: tuple = (BLOCK,)
    variants: tuple = ("sets",)
    calibration: int | None = None

    @property
    def default_sets(self) -> tuple:
        """Every default set the method belongs to: ``"dashboard"`` (``default``), ``"cli"`` (``cli_default``) and
        those of ``default_in``."""
        return ("dashboard",) * self.default + ("cli",) * self.cli_default + tuple(self.default_in)

    @property
    def seeded(self) -> bool:
        return self.runs > 0

    @property
    def calibrated(self) -> bool:
        """Whether the method reads calibration text (and so takes a ``calib_tokens`` parameter)."""
        return self.calibration is not None

    @property
    def func(self) -> Callable:
        """The method ``func(ctx, budget) -> MethodOutput`` (its module is imported here, on first use)."""
        return load(self.target)

    @property
    def cost(self) -> Callable:
        """``cost(spec, plan)``: the method's own, else one evaluation per curve point."""
        return cost_per_point if self.cost_target is None else load(self.cost_target)

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
    unit: str = BLOCK  # what a removed index removes: the block, or its attention / mlp sublayer (skipped)
    bridger: object = None  # the run's swapkl.repair.bridger.Bridger when it repairs with a bridge, else None
    contract: object = None  # the run's scoring Contract: a method's own bridges score on its prompts (None: default)
    _calib_ids: object = None
    _prefix: dict = field(default_factory=dict)  # calibration memo key -> PrefixStore of the base's states on that text

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

    def calib_region_ids(self, region: int, tokens: int):
        """Calibration region ``region`` (0-based): tokens ``[region·tokens, (region+1)·tokens)`` of the prompt region's
        start (region 0 is :meth:`calib_ids`).  Disjoint from each other and from the evaluation text.  Raises
        :class:`SwapklError` when the prompt region is too short for it."""
        ids = self.calib_ids((region + 1) * tokens)
        if ids.numel() < (region + 1) * tokens:
            raise SwapklError(f"corpus '{self.corpus.name}' has {ids.numel()} calibration tokens; calibration region "
                              f"{region + 1} needs {(region + 1) * tokens}")
        return ids[region * tokens:(region + 1) * tokens]

    def calib_result(self, removed: Sequence[int], max_tokens: int = 2048, window: int | None = None,
                     stride: int | None = None, region: int = 0):
        """The :class:`~swapkl.measure.evaluate.PPLResult` (per-window NLL) of the model without ``removed`` on
        calibration region ``region`` (``max_tokens`` tokens; region 0 = :meth:`calib_ids`), memoised.  ``window``
        (tokens, default the evaluator's) and ``stride`` (default = ``window``: non-overlapping windows, SLEB's
        convention; the evaluator's stride scores every token with the held-out evaluator's context)."""
        from swapkl.measure import evaluate as E  # deferred (torch), as above
        from swapkl.surgery.skip import removed_copy

        ids = self.calib_ids(max_tokens) if region == 0 else self.calib_region_ids(region, max_tokens)
        win = min(window or self.evaluator.window, ids.numel())
        step = min(stride or win, win)
        key = (f"calib:{getattr(self.corpus, 'sha256', '?')}:{ids.numel()}:{win}" + (f":s{step}" if step != win else "")
               + (f":r{region}" if region else "") + (f":{self.unit}" if self.unit != BLOCK else ""))
        if self.should_stop is not None and self.should_stop():
            raise ComputeInterrupted("stopped")

        def run(model):
            return E.evaluate_ppl(model, ids, win, step, batch_size=self.batch_size)

        def compute():
            if not removed:
                return run(self._recording(key))
            if key not in self._prefix:  # the base's states first: every trial set then runs only its own blocks
                base = run(self._recording(key))
                self.memo.get(key, (), lambda: base)  # kept when the memo lacks it (identical numbers otherwise)
            pm = removed_copy(self.model, removed, self.unit)
            self._prefix[key].attach(pm, removed)
            return run(pm)
        return self.memo.get(key, removed, compute)

    def _recording(self, key: str):
        """The base model as a private copy that records, per batch of calibration windows, the state entering every
        block (:class:`~swapkl.measure.prefix.PrefixStore`, kept under ``key``; the stores of all calibration texts
        together hold at most ``prefix.CURVES_STATES_BYTES``): a trial set whose first removed block is f then runs
        only blocks f.. on them, bit for bit the plain evaluation (docs/removal.md, Work reuse)."""
        from swapkl.measure import prefix

        left = prefix.CURVES_STATES_BYTES - sum(st.bytes for k, st in self._prefix.items() if k != key)  # one bound for all
        self._prefix[key], copy = prefix.recording_every_block(self.model, self.num_layers, max(0, left))
        return copy

    def calib_ppl(self, removed: Sequence[int], max_tokens: int = 2048, window: int | None = None,
                  stride: int | None = None) -> float:
        """PPL of the model without ``removed`` on the calibration text (region 0), memoised; see
        :meth:`calib_result`."""
        return self.calib_result(removed, max_tokens, window, stride).ppl
