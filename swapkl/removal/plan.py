"""One removal run, decided once: :class:`RemovalPlan` (what to remove and how to measure it) and :class:`RunHooks`
(the run-time plumbing: progress, stop, per-curve callback, memo, corpus).

A plan is built at the edge -- a CLI command (:func:`swapkl.commands.common.removal_plan`) or the dashboard's
request (:meth:`swapkl.jobs.requests.AnalysisRequest.removal_plan`) -- and every removal entry point takes it:
:func:`swapkl.removal.curves.removal_curves`, :func:`swapkl.removal.recommend.recommend`,
:func:`swapkl.removal.tasks.removal_sets` / :func:`~swapkl.removal.tasks.task_accuracy` and
:func:`swapkl.healing.multi.heal_curves`.  Its checks live here and nowhere downstream: the constructor refuses
what is wrong whatever the model (a budget below 1, an unknown method, unit or repair), and :meth:`RemovalPlan.check`
refuses what is wrong for one model (candidates out of range, a budget the candidates cannot hold under the
spacing, methods whose scores are missing or that do not apply to the unit).  Each refusal is one line
(:class:`~swapkl.errors.SwapklError`).  The plan is frozen, so a run cannot change it half-way, and
:meth:`RemovalPlan.to_dict` is what a result records of it.

No torch here: the dashboard builds plans before torch is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from swapkl.contract import BLOCK, check_unit
from swapkl.errors import ContractError, SwapklError
from swapkl.removal import methods as M
from swapkl.removal.checks import check_scores
from swapkl.removal.selection import as_matrix, check_budget, default_candidates
from swapkl.repair import forms
from swapkl.repair.settings import FIELDS, BridgeSettings

#: the repairs a plan may ask for after removal: none, or a linear bridge in place of each removed span
#: (:mod:`swapkl.repair`; docs/repair.md "Removal with repair")
REPAIRS = ("none", "bridge")
#: the fields of a plan's ``bridge`` settings, its forms and their defaults (:class:`swapkl.repair.settings.BridgeSettings`,
#: the one place they are checked)
BRIDGE_FIELDS = FIELDS
BRIDGE_FORMS = forms.NAMES
BRIDGE_DEFAULTS = BridgeSettings().to_dict()

def _freeze(v):
    """A read-only copy of a JSON-like value: dicts become mappings that refuse writes, lists tuples."""
    if isinstance(v, Mapping):
        return MappingProxyType({str(k): _freeze(x) for k, x in v.items()})
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw(v):
    """The plain, writable form of :func:`_freeze`'s value (dicts and lists)."""
    if isinstance(v, Mapping):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


def _bridge(d, repair: str) -> tuple[dict, BridgeSettings]:
    """The fields the plan was given (what it records) and the :class:`BridgeSettings` they make (checked there, one
    line each); ``{}``: the defaults.  Settings without ``repair="bridge"`` are refused."""
    settings = BridgeSettings.from_dict(d)
    given = {f: getattr(settings, f) for f in FIELDS if isinstance(d, BridgeSettings) or (d or {}).get(f) is not None}
    if given and repair != "bridge":
        raise ContractError("bridge settings go with repair 'bridge'")
    return given, settings


def _int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ContractError(f"{name} must be an integer of at least {lo} (got {v!r})")
    return int(v)


def _partners(p):
    """None (every scored pair), ``"adjacent"``, an int K (|i-j| <= K) or (i, j) pairs; ``"all"`` is None."""
    if p is None or p == "all":
        return None
    if p == "adjacent" or (isinstance(p, int) and not isinstance(p, bool) and p >= 1):
        return p
    if isinstance(p, (list, tuple)) and all(isinstance(q, (list, tuple)) and len(q) == 2 for q in p):
        return tuple((int(i), int(j)) for i, j in p)
    raise ContractError(f"partners must be adjacent, all, an integer K >= 1 or (i, j) pairs (got {p!r})")


def _with_calibration(params: Mapping, calib_tokens: int | None, methods: Sequence[str]) -> dict:
    """``params`` with a run's ``calib_tokens`` given to every calibration method of ``methods`` and of the
    recommendation's seeds (:func:`swapkl.removal.methods.calibration_params`: one-line refusal below its minimum);
    the run's count wins over a per-method one.  None: ``params`` as they are (each method reads its default)."""
    out = {k: dict(v) for k, v in params.items()}
    if calib_tokens is None:
        return out
    seeds = list((params.get("recommend") or {}).get("seeds") or ())
    for m, p in M.calibration_params(calib_tokens, list(methods) + seeds).items():
        out[m] = out.get(m, {}) | p
    return out


@dataclass(frozen=True)
class RemovalPlan:
    """What one removal run removes and how it measures it (immutable; see the module docstring).

    ``budget``: curves for n = 1..budget (removed units); ``methods``: method names or groups of the registry (empty:
    the dashboard's default set); ``unit``: ``block``, ``attention`` or ``mlp``; ``spacing`` Δ, ``exclude_boundary``,
    ``candidates`` (layer indices; None = every layer but the first and last with ``exclude_boundary``) and
    ``partners``: the selection rule (docs/method.md §4); ``seeds``: the seeded methods' seeds (None = as many as the
    most-seeded method runs); ``evaluator``: ``"matched"`` / ``"standard"``, an
    :class:`~swapkl.measure.evaluate.Evaluator` or its settings dict; ``calib_tokens``: the calibration tokens of every calibration method
    (None: each method's registered default; given, it is written into ``method_params`` of each such method); ``method_params``: ``{method: {option: value}}``, read-only (a
    writable copy: :meth:`params`); ``batch_size``: windows per forward (None = the evaluator's default); ``kl``: also
    KL(base || pruned) per token; ``repair``: what is done after removal (``"none"``, or ``"bridge"``: every set is
    also evaluated with a linear bridge in place of each removed span, blocks only); ``bridge``: the bridge's settings,
    a :class:`swapkl.repair.settings.BridgeSettings` or a dict of some of its fields (``{}`` = its defaults); the
    plan records the fields given and hands the validated object on as :attr:`bridge_settings`."""

    budget: int
    methods: tuple = ()
    unit: str = BLOCK
    spacing: int = 1
    exclude_boundary: bool = True
    candidates: tuple | None = None
    partners: object = None
    seeds: tuple | None = None
    evaluator: object = "matched"
    calib_tokens: int | None = None
    method_params: Mapping = field(default_factory=dict)
    batch_size: int | None = None
    kl: bool = True
    repair: str = "none"
    bridge: Mapping = field(default_factory=dict)

    def __post_init__(self):
        put = lambda k, v: object.__setattr__(self, k, v)
        put("budget", _int("the budget", self.budget, 1))
        names = tuple(m.strip() for m in (self.methods or ()) if isinstance(m, str) and m.strip())
        if len(names) != len(tuple(self.methods or ())):
            raise ContractError(f"methods must be non-empty names (got {list(self.methods)!r})")
        for m in names:
            if m not in M.GROUPS:
                M.get(m)  # "unknown method X; available: ..."
        put("methods", tuple(dict.fromkeys(names)) or tuple(M.default_set("dashboard")))
        check_unit(self.unit)
        put("spacing", _int("the spacing Δ", self.spacing, 0))
        if self.candidates is not None:
            put("candidates", tuple(sorted({_int("a candidate layer", c, 0) for c in self.candidates})))
        put("partners", _partners(self.partners))
        if self.seeds is not None:
            put("seeds", tuple(_int("a seed", s, 0) for s in self.seeds))
            if not self.seeds:
                raise ContractError("seeds must name at least one seed")
        if isinstance(self.evaluator, Mapping):
            put("evaluator", _freeze(self.evaluator))
        elif not isinstance(self.evaluator, str) and not hasattr(self.evaluator, "to_dict"):
            raise ContractError(f"evaluator must be a name, an Evaluator or its settings (got {self.evaluator!r})")
        if self.batch_size is not None:
            put("batch_size", _int("batch_size", self.batch_size, 1))
        if not isinstance(self.method_params, Mapping) or not all(
                isinstance(v, Mapping) for v in self.method_params.values()):
            raise ContractError("method_params must be {method: {option: value}}")
        put("method_params", _freeze(_with_calibration(self.method_params, self.calib_tokens, self.methods)))
        put("kl", bool(self.kl))
        if self.repair not in REPAIRS:
            raise ContractError(f"unknown repair '{self.repair}'; choose one of: {', '.join(REPAIRS)}")
        if self.repair == "bridge" and self.unit != BLOCK:
            raise ContractError(f"--repair bridge replaces whole blocks: a bridge cannot stand in for the {self.unit} "
                                "sublayer (use --unit block)")
        given, settings = _bridge(self.bridge or {}, self.repair)
        put("bridge", _freeze(given))
        put("_settings", settings)

    @property
    def bridge_settings(self) -> BridgeSettings:
        """The bridge's settings as the one validated object (the defaults where the plan gives none): what every
        bridge of the run is fitted with (:class:`~swapkl.repair.bridger.Bridger`)."""
        return self._settings

    def params(self) -> dict:
        """``method_params`` as a plain, writable dict (a copy: the plan stays as it is)."""
        return _thaw(self.method_params)

    def with_(self, **changes) -> RemovalPlan:
        """A new plan with ``changes`` (checked again)."""
        from dataclasses import replace

        return replace(self, **changes)

    def check(self, num_layers: int, scores: dict | None = None) -> CheckedPlan:
        """The one check of this plan against a model of ``num_layers`` layers and its ``scores``
        (``{"replacement"/"interchange": L×L}`` nats; None or missing = not scored): the score shapes, the
        candidates' range, the methods resolved (groups expanded to the members whose scores are given), the unit's
        methods, and the budget against the candidates under the spacing rule.  Returns the :class:`CheckedPlan`
        the runner works from; raises one-line :class:`~swapkl.errors.SwapklError` s."""
        L = _int("the layer count", num_layers, 1)
        mats = {k: as_matrix(v) for k, v in (scores or {}).items() if v is not None}
        check_scores(mats, L)
        specs = tuple(M.resolve(list(self.methods), mats))
        if self.unit != BLOCK:
            M.refuse_other_units([s.name for s in specs], self.unit)
        cands = list(self.candidates) if self.candidates is not None else default_candidates(L, self.exclude_boundary)
        out = [c for c in cands if c >= L]
        if out:
            raise ContractError(f"candidate layer(s) {out} out of range 0..{L - 1}")
        if any(s.rule_candidates for s in specs):
            check_budget(self.budget, cands, self.spacing)
        seeds = list(self.seeds) if self.seeds is not None else M.default_seeds(specs)
        return CheckedPlan(self, L, mats, specs, cands, seeds)

    def expected_evaluations(self, num_layers: int, scores: dict | None = None) -> int:
        """Distinct perplexity evaluations this plan's curves need on a model of ``num_layers`` layers, baseline
        included: each method's cost (its planned sets, deduplicated across methods, or a count; one per curve point
        and seed by default).  An estimate for methods whose sets depend on evaluations (SLEB, the search); a method
        whose sets cannot be planned counts ``budget``.  With ``repair="bridge"`` every one but the baseline is
        counted twice (raw and bridged; a merge or mixed-unit method is not bridged).  The progress total of a run
        (the runner's and the dashboard's)."""
        return self.check(num_layers, scores).expected_evaluations()

    def evaluator_dict(self) -> dict | str:
        """The evaluator as recorded: its name, or its settings (``{name, max_words, window, stride, ...}``)."""
        if isinstance(self.evaluator, str):
            return self.evaluator
        return _thaw(self.evaluator) if isinstance(self.evaluator, Mapping) else dict(self.evaluator.to_dict())

    def to_dict(self) -> dict:
        """Every field, JSON-able: what a result records of the plan it ran."""
        p = self.partners
        return {"budget": self.budget, "methods": list(self.methods), "unit": self.unit, "spacing": self.spacing,
                "exclude_boundary": self.exclude_boundary,
                "candidates": None if self.candidates is None else list(self.candidates),
                "partners": p if p is None or isinstance(p, (str, int)) else [list(q) for q in p],
                "seeds": None if self.seeds is None else list(self.seeds), "evaluator": self.evaluator_dict(),
                "calib_tokens": self.calib_tokens, "method_params": self.params(), "batch_size": self.batch_size,
                "kl": self.kl, "repair": self.repair, "bridge": _thaw(self.bridge)}


@dataclass(frozen=True)
class CheckedPlan:
    """A plan checked against one model (:meth:`RemovalPlan.check`): the layer count ``num_layers``, the score
    matrices ``scores`` (float64 L×L), the resolved method ``specs`` in run order, the selection ``candidates`` and
    the ``seeds``."""

    plan: RemovalPlan
    num_layers: int
    scores: dict
    specs: tuple
    candidates: list
    seeds: list

    def context(self, model, tokenizer, hooks: RunHooks | None = None, *, corpus, evaluator, memo, progress=None,
                bridger=None) -> M.MethodContext:
        """The one :class:`~swapkl.removal.methods.MethodContext` of this plan: every method of every run of the plan
        (curves, task accuracy, a heal's chosen set, evidence) sees the same scores, candidates, spacing, partners,
        seeds, per-method parameters and unit, so it chooses the same sets.  ``hooks``: the stop flag and the scoring
        contract; ``corpus``, ``evaluator``, ``memo``: the run's; ``progress(done, total, message)``: a method's
        progress; ``bridger``: the run's :class:`~swapkl.repair.bridger.Bridger` with ``repair="bridge"``."""
        hooks = hooks if hooks is not None else RunHooks()
        plan = self.plan
        return M.MethodContext(model=model, tokenizer=tokenizer, scores=self.scores, num_layers=self.num_layers,
                               candidates=list(self.candidates), spacing=plan.spacing, partners=plan.partners,
                               corpus=corpus, evaluator=evaluator, seeds=list(self.seeds), memo=memo,
                               batch_size=plan.batch_size, should_stop=hooks.should_stop, progress=progress,
                               params=plan.params(), unit=plan.unit, bridger=bridger, contract=hooks.contract)

    def expected_evaluations(self) -> int:
        """See :meth:`RemovalPlan.expected_evaluations`."""
        ev = M.EvalPlan(budget=self.plan.budget, num_layers=self.num_layers, scores=self.scores,
                        candidates=list(self.candidates), spacing=self.plan.spacing, seeds=list(self.seeds))
        sets: set = set()
        extra = bridged_extra = 0
        bridged = self.plan.repair == "bridge"
        for spec in self.specs:
            try:
                c = spec.cost(spec, ev)
            except SwapklError:
                c = ev.budget
            if isinstance(c, int):
                extra += c
                if bridged and not set(spec.variants) & {"merge", "units"}:
                    bridged_extra += ev.budget * (len(ev.seeds) if spec.seeded else 1)
            else:
                sets.update(frozenset(s) for s in c)
        return 1 + (2 if bridged else 1) * len(sets) + extra + bridged_extra


@dataclass
class RunHooks:
    """The run-time side of a removal run, kept out of the plan (it does not change what is measured):
    ``progress(done, total, message)``; ``should_stop()`` → True stops with
    :class:`~swapkl.errors.ComputeInterrupted`; ``on_curve(name, partial_result)`` after each method's curve;
    ``on_partial(result)`` after each step of a run that publishes its whole partial result (task accuracy after every
    model, healed curves after every heal);
    ``memo``: an :class:`~swapkl.measure.memo.EvalMemo` shared across calls (default: the model's disk memo);
    ``identity``: the checkpoint's identity (names the weights for the disk memo and the result); ``corpus``: a
    :class:`~swapkl.scoring.corpora.Corpus` (default: the built-in one); ``eval_ids``: the evaluation token ids when
    already tokenised; ``contract``: the scoring :class:`~swapkl.contract.Contract` whose prompts a bridge's
    calibration text avoids (``repair="bridge"``) and a bridge-guided method scores on (default: the default
    contract)."""

    progress: Callable | None = None
    should_stop: Callable | None = None
    on_curve: Callable | None = None
    on_partial: Callable | None = None
    memo: object = None
    identity: dict | None = None
    corpus: object = None
    eval_ids: object = None
    contract: object = None

    def stopped(self) -> bool:
        return self.should_stop is not None and bool(self.should_stop())


def plan_of(budget: int, methods: Sequence[str] = (), **fields) -> RemovalPlan:
    """A :class:`RemovalPlan` from a budget, methods and any other of its fields (a short form for scripts)."""
    return RemovalPlan(budget=budget, methods=tuple(methods or ()), **fields)
