"""What a page asks the job manager for: :class:`AnalysisRequest`, :class:`TrajectoryRequest` and
:class:`TasksRequest`, :class:`HealRequest`, and the job
key (:func:`request_key`: the request, a cheap content fingerprint of the model files and the swapkl version)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swapkl import __version__
from swapkl.removal import methods as M
from swapkl.removal.plan import REPAIRS, RemovalPlan
from swapkl.repair import forms
from swapkl.model.fingerprint import quick_fingerprint
from swapkl.contract import BLOCK, Contract, stable_hash
from swapkl.errors import ContractError
from swapkl.trajectory.checkpoints import parse_checkpoints
def _evaluator_dict(ev) -> dict | None:
    """An evaluator given as a name (``"matched"``), an :class:`~swapkl.measure.evaluate.Evaluator` or its dict -> dict."""
    if ev is None:
        return None
    if isinstance(ev, dict):
        return dict(ev)
    if isinstance(ev, str):
        from swapkl.measure.evaluate import get_evaluator  # deferred: swapkl.evaluate imports torch

        return get_evaluator(ev).to_dict()
    return ev.to_dict()


@dataclass(frozen=True)
class AnalysisRequest:
    """One dashboard analysis: both protocols under ``contract``, then removal curves up to ``budget``.

    ``budget = 0`` or no ``methods`` skips the curves.  ``evaluator``: ``"matched"`` / ``"standard"``, an
    :class:`~swapkl.measure.evaluate.Evaluator`, or its dict (stored as the dict).  ``repair``: what is done after
    each removal (``"none"``, or ``"bridge"``: a linear bridge fitted in place of each removed span, the curves
    drawn raw and bridged); ``bridge``: the bridge's settings (fields of
    :class:`~swapkl.repair.settings.BridgeSettings`, e.g. ``{"form": "folded", "calib_tokens": 8192}``; ``{}``:
    the defaults), checked by :func:`swapkl.jobs.forms.bridge_settings`.  Both reach the plan unchanged
    (:meth:`plan_fields`)."""

    model: str = "default"
    revision: str | None = None
    contract: Contract = field(default_factory=Contract)
    budget: int = 0
    methods: tuple = field(default_factory=lambda: M.default_set("dashboard"))
    evaluator: Any = None
    kind: str = "analysis"
    repair: str = "none"
    bridge: Any = None

    def __post_init__(self):
        object.__setattr__(self, "model", str(self.model).strip())
        object.__setattr__(self, "revision", (str(self.revision).strip() or None) if self.revision else None)
        object.__setattr__(self, "methods", tuple(m for m in self.methods if m))
        object.__setattr__(self, "evaluator", _evaluator_dict(self.evaluator))
        object.__setattr__(self, "budget", int(self.budget or 0))
        object.__setattr__(self, "repair", str(self.repair or "none"))
        object.__setattr__(self, "bridge", dict(self.bridge or {}) if self.repair != "none" else {})

    def to_dict(self) -> dict:
        """The request as JSON; the repair only when there is one (a request without repair keeps its job key)."""
        d = {"kind": self.kind, "model": self.model, "revision": self.revision,
             "contract": self.contract.to_dict(), "budget": self.budget, "methods": list(self.methods),
             "evaluator": self.evaluator}
        if self.repair != "none":
            d.update(repair=self.repair, bridge=dict(self.bridge))
        return d

    @property
    def wants_curves(self) -> bool:
        return self.budget > 0 and bool(self.methods)

    def plan_fields(self) -> dict:
        """The keyword arguments of the removal plan: ``budget``, the guided methods first
        (:func:`swapkl.removal.methods.run_order`; for a sublayer unit only the methods that apply per unit,
        :func:`swapkl.removal.methods.for_unit`), the contract's unit, the evaluator, and -- only when there is one
        -- the ``repair`` with its ``bridge`` settings (the plan's data contract)."""
        unit = getattr(self.contract, "unit", BLOCK)
        order = M.run_order(self.methods)
        if unit != BLOCK:  # a sublayer curve: the methods that apply per unit (the registry's data)
            order = M.for_unit(order, unit)
        out = {"budget": self.budget, "methods": tuple(order), "unit": unit, "evaluator": self.evaluator or "matched"}
        if self.repair != "none":
            out.update(repair=self.repair, bridge=dict(self.bridge))
        return out

    def removal_plan(self) -> RemovalPlan:
        """The removal plan of the curves (:class:`~swapkl.removal.plan.RemovalPlan` of :meth:`plan_fields`,
        checked: one-line errors, an unknown repair included)."""
        f = self.plan_fields()
        if f.get("repair", "none") not in REPAIRS:
            raise ContractError(f"unknown repair '{f['repair']}'; choose one of: {', '.join(REPAIRS)}")
        return RemovalPlan(**f)

    def label(self) -> str:
        m = self.model + (f"@{self.revision}" if self.revision else "")
        c = self.contract
        s = f"{m} · pairs {c.pairs} · {c.prompts}×{c.tokens}" + (f" · unit {c.unit}" if c.unit != "block" else "")
        rep = f" · repair {self.repair}" if self.repair != "none" and self.wants_curves else ""
        return s + (f" · budget {self.budget}" if self.wants_curves else "") + rep


@dataclass(frozen=True)
class EvidenceRequest:
    """How far to trust a layer ranking (docs/evidence.md): ground truth, agreement and stability for the model
    under ``contract``; ``budget``: stability for n = 1..budget; ``n_boot``: prompt resamples for stability
    (the agreement CIs use ``5 * n_boot``).  ``repair`` ``"bridge"``: also the "after repair" part (each block
    removed with its linear bridge, ``compute_evidence(repair=BridgeSettings(**bridge))``; docs/evidence.md);
    ``bridge``: the bridge's settings (fields of :class:`~swapkl.repair.settings.BridgeSettings`, ``{}``: the
    defaults), checked by :func:`swapkl.jobs.forms.bridge_settings`.  Without a repair the request's dict (and so
    its job key) holds neither field."""

    model: str = "default"
    revision: str | None = None
    contract: Contract = field(default_factory=Contract)
    budget: int = 4
    evaluator: Any = None
    n_boot: int = 200
    kind: str = "evidence"
    repair: str = "none"
    bridge: Any = None
    tasks: tuple = ()
    limit: int | None = None
    num_fewshot: int | None = None
    include_path: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "model", str(self.model).strip())
        object.__setattr__(self, "revision", (str(self.revision).strip() or None) if self.revision else None)
        object.__setattr__(self, "evaluator", _evaluator_dict(self.evaluator))
        object.__setattr__(self, "budget", int(self.budget))
        object.__setattr__(self, "n_boot", int(self.n_boot))
        object.__setattr__(self, "repair", str(self.repair or "none"))
        object.__setattr__(self, "bridge", dict(self.bridge or {}) if self.repair != "none" else {})
        object.__setattr__(self, "tasks", tuple(str(t).strip() for t in self.tasks or () if str(t).strip()))

    def task_settings(self):
        """The :class:`~swapkl.measure.task_runner.TaskSettings` of the task ground truth (None without tasks)."""
        return task_settings(self)

    def to_dict(self) -> dict:
        """The request as JSON; the repair only when there is one (a request without repair keeps its job key)."""
        d = {"kind": self.kind, "model": self.model, "revision": self.revision,
             "contract": self.contract.to_dict(), "budget": self.budget, "evaluator": self.evaluator,
             "n_boot": self.n_boot}
        if self.repair != "none":
            d.update(repair=self.repair, bridge=dict(self.bridge))
        if self.tasks:  # a request without tasks keeps its job key
            d.update(tasks=list(self.tasks), limit=self.limit, num_fewshot=self.num_fewshot,
                     include_path=self.include_path)
        return d

    def bridge_settings(self):
        """The :class:`~swapkl.repair.settings.BridgeSettings` of the repair (None without one); settings the
        bridge refuses raise :class:`~swapkl.errors.ContractError` (one line)."""
        if self.repair == "none":
            return None
        if self.repair != "bridge":
            raise ContractError(f"unknown repair '{self.repair}'; choose one of: none, bridge")
        from swapkl.repair.settings import BridgeSettings  # deferred: imports numpy and the repair package

        return BridgeSettings.from_dict(self.bridge)

    def label(self) -> str:
        m = self.model + (f"@{self.revision}" if self.revision else "")
        c = self.contract
        rep = ""
        if self.repair != "none":
            b = self.bridge
            rep = (f" · after a linear bridge ({b.get('form', forms.DEFAULT)}, "
                   f"{b.get('calib_tokens', 'default')} calibration tokens)")
        tasks = (f" · task ground truth {', '.join(self.tasks)} (first {self.limit} documents)" if self.limit else
                 f" · task ground truth {', '.join(self.tasks)}") if self.tasks else ""
        return (f"evidence: {m} · pairs {c.pairs} · {c.prompts}×{c.tokens} · budget {self.budget} · "
                f"B={self.n_boot}{rep}{tasks}")


@dataclass(frozen=True)
class CompareRequest:
    """The transfer of the decision from model A to model B (docs/compare.md §2): both scored under ``contract``,
    B's held-out ΔPPL of A's set against B's own for n = 1..``budget`` on ``evaluator``."""

    model_a: str = "default"
    revision_a: str | None = None
    model_b: str = "default"
    revision_b: str | None = None
    contract: Contract = field(default_factory=Contract)
    budget: int = 3
    evaluator: Any = None
    kind: str = "compare"

    def __post_init__(self):
        for side in ("a", "b"):
            object.__setattr__(self, f"model_{side}", str(getattr(self, f"model_{side}")).strip())
            rev = getattr(self, f"revision_{side}")
            object.__setattr__(self, f"revision_{side}", (str(rev).strip() or None) if rev else None)
        object.__setattr__(self, "evaluator", _evaluator_dict(self.evaluator))
        object.__setattr__(self, "budget", int(self.budget))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model_a": self.model_a, "revision_a": self.revision_a, "model_b": self.model_b,
                "revision_b": self.revision_b, "contract": self.contract.to_dict(), "budget": self.budget,
                "evaluator": self.evaluator}

    def label(self) -> str:
        a = self.model_a + (f"@{self.revision_a}" if self.revision_a else "")
        b = self.model_b + (f"@{self.revision_b}" if self.revision_b else "")
        c = self.contract
        return f"compare: {a} → {b} · pairs {c.pairs} · {c.prompts}×{c.tokens} · budget {self.budget}"


@dataclass(frozen=True)
class TrajectoryRequest:
    """Both protocols on every checkpoint of ``checkpoints`` (a list text for
    :func:`swapkl.trajectory.checkpoints.parse_checkpoints`) under ``contract``.  ``train_demo=True``: ``checkpoints`` is
    a folder that :func:`swapkl.trajectory.demo.train_demo_trajectory` first fills (reused when already
    trained with the default settings)."""

    checkpoints: str
    contract: Contract = field(default_factory=Contract)
    train_demo: bool = False
    kind: str = "trajectory"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "checkpoints": self.checkpoints.strip(), "contract": self.contract.to_dict(),
                "train_demo": self.train_demo}

    def label(self) -> str:
        what = "demo trajectory" if self.train_demo else f"trajectory of {self.checkpoints.strip()[:60]}"
        return f"{what} · pairs {self.contract.pairs}"


@dataclass(frozen=True)
class TasksRequest:
    """Task accuracy after removal (:func:`swapkl.removal.tasks.task_accuracy`): the base model and each method's
    pruned model at n = 1..``budget`` on lm-eval ``tasks``, with the swap-KL scores of ``contract`` for the guided
    methods.  ``include_path``: a folder of local task YAMLs -- code that runs; a local user's choice, and in demo
    mode only the server operator's configured folder (:meth:`swapkl.jobs.policy.Policy.check_request`)."""

    model: str = "default"
    revision: str | None = None
    contract: Contract = field(default_factory=Contract)
    budget: int = 4
    methods: tuple = field(default_factory=lambda: M.default_set("tasks"))
    tasks: tuple = ()
    limit: int | None = None
    num_fewshot: int | None = None
    include_path: str | None = None
    kind: str = "tasks"

    def __post_init__(self):
        object.__setattr__(self, "model", str(self.model).strip())
        object.__setattr__(self, "revision", (str(self.revision).strip() or None) if self.revision else None)
        object.__setattr__(self, "methods", tuple(str(m) for m in self.methods if m))
        object.__setattr__(self, "tasks", tuple(str(t).strip() for t in self.tasks if str(t).strip()))
        object.__setattr__(self, "budget", int(self.budget or 0))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "revision": self.revision,
                "contract": self.contract.to_dict(), "budget": self.budget, "methods": list(self.methods),
                "tasks": list(self.tasks), "limit": self.limit, "num_fewshot": self.num_fewshot,
                "include_path": self.include_path}

    def removal_plan(self) -> RemovalPlan:
        """The plan whose sets are scored (:class:`~swapkl.removal.plan.RemovalPlan`: ``budget``, ``methods``)."""
        return RemovalPlan(budget=self.budget, methods=self.methods)

    def label(self) -> str:
        m = self.model + (f"@{self.revision}" if self.revision else "")
        lim = f" · limit {self.limit}" if self.limit else ""
        return f"{m} · tasks {', '.join(self.tasks)} · budget {self.budget}{lim}"


@dataclass(frozen=True)
class HealRequest:
    """Healed curves (:func:`swapkl.healing.multi.heal_curves`): the set each of ``methods`` chooses at each n of
    ``ns`` (with the swap-KL scores of ``contract`` for the guided methods), healed with one LoRA ``recipe`` (a
    :class:`~swapkl.healing.recipe.Recipe` dict) against one control, on the removal evaluator ``evaluator``.
    Demo mode bounds the steps, tokens, rank and n (:func:`swapkl.jobs.policy.check_heal`).  With ``tasks``: also
    lm-eval task accuracy of the fine-tuned base and each healed model (:mod:`swapkl.healing.tasks`; ``limit``,
    ``num_fewshot``, ``include_path`` as in :class:`TasksRequest`, bounded in demo mode the same way).  ``repair``
    ``"bridge"``: every heal starts from the bridged model (the linear bridge of ``bridge``'s settings in place of
    each removed span, the plan's repair), as ``heal --repair bridge``."""

    model: str = "default"
    revision: str | None = None
    contract: Contract = field(default_factory=Contract)
    methods: tuple = ("interchange", "replacement")
    ns: tuple = (1, 2)
    recipe: Any = None
    evaluator: Any = None
    spacing: int = 1
    tasks: tuple = ()
    limit: int | None = None
    num_fewshot: int | None = None
    include_path: str | None = None
    kind: str = "heal"
    repair: str = "none"
    bridge: Any = None

    def __post_init__(self):
        from swapkl.healing.recipe import Recipe

        object.__setattr__(self, "repair", str(self.repair or "none"))
        object.__setattr__(self, "bridge", dict(self.bridge or {}) if self.repair != "none" else {})

        object.__setattr__(self, "model", str(self.model).strip())
        object.__setattr__(self, "revision", (str(self.revision).strip() or None) if self.revision else None)
        object.__setattr__(self, "methods", tuple(dict.fromkeys(str(m) for m in self.methods if m)))
        object.__setattr__(self, "ns", tuple(sorted({int(n) for n in self.ns})))
        r = self.recipe if isinstance(self.recipe, Recipe) else Recipe.from_dict(dict(self.recipe or {}))
        object.__setattr__(self, "recipe", {k: v for k, v in r.__dict__.items()})
        object.__setattr__(self, "evaluator", _evaluator_dict(self.evaluator))
        object.__setattr__(self, "spacing", int(self.spacing))
        object.__setattr__(self, "tasks", tuple(str(t).strip() for t in self.tasks if str(t).strip()))

    def recipe_obj(self):
        from swapkl.healing.recipe import Recipe

        return Recipe.from_dict(self.recipe)

    def removal_plan(self) -> RemovalPlan:
        """The plan whose sets are healed: budget = the largest n, ``methods``, ``spacing``, the evaluator and the
        repair every heal starts from."""
        return RemovalPlan(budget=max(self.ns, default=0), methods=self.methods, spacing=self.spacing,
                           evaluator=self.evaluator or "matched", repair=self.repair, bridge=self.bridge)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "revision": self.revision,
                "contract": self.contract.to_dict(), "methods": list(self.methods), "ns": list(self.ns),
                "recipe": dict(self.recipe), "evaluator": self.evaluator, "spacing": self.spacing,
                **({"tasks": list(self.tasks), "limit": self.limit, "num_fewshot": self.num_fewshot,
                    "include_path": self.include_path} if self.tasks or self.include_path else {}),
                **({"repair": self.repair, "bridge": dict(self.bridge)} if self.repair != "none" else {})}

    def setup_fields(self) -> dict:
        """The request's repair, ``{"repair", "bridge"}`` (``{}`` without one): what :meth:`removal_plan` gives the
        plan every heal of the job starts from."""
        return {"repair": self.repair, "bridge": dict(self.bridge)} if self.repair != "none" else {}

    def label(self) -> str:
        m = self.model + (f"@{self.revision}" if self.revision else "")
        tasks = f" · tasks {', '.join(self.tasks)}" if self.tasks else ""
        rep = " · from the bridged model" if self.repair != "none" else ""
        return (f"healing: {m} · {', '.join(self.methods)} · n = {', '.join(map(str, self.ns))} · "
                f"{self.recipe_obj().describe()}{rep}{tasks}")


def request_key(request) -> str:
    """The job key: hash of the request, the model fingerprint(s) and the swapkl version."""
    d = request.to_dict()
    if request.kind in ("analysis", "evidence", "tasks", "heal", "export"):
        d["fingerprint"] = quick_fingerprint(request.model, request.revision)
    elif request.kind == "compare":
        d["fingerprint"] = [quick_fingerprint(request.model_a, request.revision_a),
                            quick_fingerprint(request.model_b, request.revision_b)]
    elif request.kind == "study":
        d["fingerprint"] = [quick_fingerprint(m.spec, m.revision) for m in request.plan.models]
    elif getattr(request, "train_demo", False):
        d["fingerprint"] = "demo"  # what the folder will hold is fixed by the demo's settings
    else:
        d["fingerprint"] = [quick_fingerprint(s.spec, s.revision) for s in parse_checkpoints(request.checkpoints)]
    return stable_hash({"request": d, "version": __version__})[:20]


def task_settings(request):
    """The :class:`~swapkl.measure.task_runner.TaskSettings` of a request with lm-eval tasks (evidence, tasks,
    heal: its ``tasks``, ``include_path``, ``limit``, ``num_fewshot``); None for a request without tasks."""
    names = tuple(getattr(request, "tasks", None) or ())
    if not names:
        return None
    from swapkl.measure.task_runner import TaskSettings

    return TaskSettings(names, include_path=request.include_path, limit=request.limit,
                        num_fewshot=request.num_fewshot)
