"""The registry of removal methods: lazy ``"module:object"`` entries, listed and described without importing any
method module (nor torch).

A method module declares its methods as data, in a module-level literal ``METHODS`` (a list of dicts: the
:func:`register` arguments, ``"run"`` naming the method's function in that module and ``"cost"`` its cost
function, if any)::

    METHODS = [{"name": "last-first", "run": "last_first", "description": "remove the deepest candidates first",
                "label": "deepest first"}]

    def last_first(ctx, budget): ...

:func:`discover` reads that literal from the file's source (``ast.literal_eval``) and registers
``"swapkl.removal.methods.<module>:last_first"``; the module is imported the first time the method runs or its
cost is asked for (:attr:`MethodSpec.func`).  A module without ``METHODS`` is imported at discovery and may
register itself with the :func:`register` decorator (a plugin written that way).  As in lm-evaluation-harness's
``MODEL_MAPPING`` with its lazy registry: the name and description are cheap, the implementation is loaded on use.
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Callable, Iterable, Sequence

from swapkl.contract import BLOCK, UNITS, check_unit
from swapkl.errors import ContractError, SwapklError
from swapkl.removal.methods.base import DEFAULT_RUNS, VARIANTS, MethodSpec
from swapkl.repair.settings import MIN_CALIB_TOKENS  # the fewest calibration tokens a run may ask for

PACKAGE = "swapkl.removal.methods"
#: modules of the package that hold no methods
NOT_METHODS = ("base", "registry")

_REGISTRY: dict[str, MethodSpec] = {}
GROUPS: dict[str, tuple[str, ...]] = {}
#: ``units="any"`` in a declaration: every unit of analysis (:data:`swapkl.contract.UNITS`)
ANY_UNIT = "any"


#: the :class:`MethodSpec` fields :func:`register` takes as keywords (how a method is shown and run by default)
SPEC_KEYS = ("label", "runs", "offered", "default", "cli_default", "default_in", "order", "style", "guided")
#: the default method sets, the methods run where none are named (:func:`default_set`), as data: a method joins
#: ``"dashboard"`` with ``"default": True``, ``"cli"`` with ``"cli_default": True`` and any set by naming it in
#: ``"default_in"``
DEFAULT_SETS = {"dashboard": "the dashboard's preselection, also report's default",
                "cli": "swapkl curves without --methods",
                "study": "a study across models (swapkl study, the Study page's request)",
                "tasks": "task accuracy after removal (swapkl tasks, the dashboard's task-accuracy request)"}
#: the capability keywords of :func:`register` (what a method supports, as data)
CAPABILITY_KEYS = ("units", "variants", "calibration")


def register(name: str, needs: Sequence[str] = (), description: str = "", group: str | None = None,
             rule_candidates: bool = True, *, cost: Callable | str | None = None, target: str | None = None,
             **spec):
    """Register a method under ``name``.  With ``target="module:object"`` the entry is lazy (the module is imported
    when the method runs) and None is returned; without it, a decorator for ``func(ctx, budget) -> MethodOutput``.
    ``needs``: score matrices the method requires (``"replacement"``, ``"interchange"``).  ``group``: an alias
    that expands to every member whose needs are met (``"anti"`` → anti-replacement, anti-interchange).
    ``rule_candidates=False``: the method chooses its own candidates (literature baselines), so the runner does
    not check the budget against the selection rule before running it.  ``cost``: its cost function (may be
    ``"module:object"``).  ``spec``: the :class:`MethodSpec` fields of :data:`SPEC_KEYS` (label defaults to the name;
    a method is not offered in the dashboard nor run by default unless it says so) and the capabilities of
    :data:`CAPABILITY_KEYS`: ``units`` (the units it removes, or ``"any"``; default whole blocks), ``variants`` (what
    it returns, :data:`~swapkl.removal.methods.base.VARIANTS`; default ``runs`` for a seeded method, else ``sets``),
    ``calibration`` (default calibration tokens; None when it reads none).  Another key, or a capability value
    outside those, raises :class:`SwapklError`."""
    bad = sorted(set(spec) - set(SPEC_KEYS) - set(CAPABILITY_KEYS))
    if bad:
        raise SwapklError(f"method {name}: unknown field(s) {', '.join(bad)}; known: "
                          f"{', '.join(SPEC_KEYS + CAPABILITY_KEYS)}")
    fields = {"label": name, "runs": 0, "offered": False, "default": False, "cli_default": False, "default_in": (),
              "order": 100, "style": None, "guided": False} | {k: v for k, v in spec.items() if k in SPEC_KEYS}
    fields["label"] = fields["label"] or name
    unknown_sets = sorted(set(fields["default_in"]) - set(DEFAULT_SETS))
    if unknown_sets or isinstance(fields["default_in"], str):
        raise SwapklError(f"method {name}: default_in {fields['default_in']!r} must list default sets among "
                          f"{', '.join(DEFAULT_SETS)}")
    caps = _capabilities(name, spec.get("units", (BLOCK,)), spec.get("variants"), spec.get("calibration"),
                         fields["runs"])

    def add(func_or_target):
        doc = "" if isinstance(func_or_target, str) else (func_or_target.__doc__ or "")
        _REGISTRY[name] = MethodSpec(name, func_or_target, tuple(needs), description or doc.strip(), rule_candidates,
                                     label=fields["label"], runs=int(fields["runs"]), offered=fields["offered"],
                                     default=fields["default"], cli_default=fields["cli_default"],
                                     default_in=tuple(fields["default_in"]), order=fields["order"],
                                     style=fields["style"], guided=fields["guided"],
                                     cost_target=cost, **caps)
        if group:
            GROUPS[group] = tuple(dict.fromkeys(GROUPS.get(group, ()) + (name,)))
        return func_or_target

    if target is not None:
        add(target)
        return None
    return add


def _capabilities(name: str, units, variants, calibration, runs: int) -> dict:
    """The capability fields of :class:`MethodSpec`, checked (``units`` resolved: ``"any"`` → every unit)."""
    units = UNITS if units == ANY_UNIT else tuple(units)
    variants = tuple(variants or (("runs",) if int(runs) > 0 else ("sets",)))
    for u in units:
        check_unit(u, lambda m: SwapklError(f"method {name}: {m}"))
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants or (int(runs) > 0) != ("runs" in variants):
        raise SwapklError(f"method {name}: variants {list(variants)} must be among {', '.join(VARIANTS)}, with "
                          f"'runs' exactly when the method is seeded")
    if calibration is not None and (not isinstance(calibration, int) or calibration < MIN_CALIB_TOKENS):
        raise SwapklError(f"method {name}: calibration must be a token count >= {MIN_CALIB_TOKENS} or None")
    return {"units": units, "variants": tuple(variants), "calibration": calibration}


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
    """The methods run when none are named, in display order: ``"dashboard"`` (the dashboard's preselection, also
    ``report``'s default), ``"cli"`` (``swapkl curves``), ``"study"`` (``swapkl study``) or ``"tasks"`` (``swapkl
    tasks``); the sets of :data:`DEFAULT_SETS`, declared by the methods themselves."""
    if kind not in DEFAULT_SETS:
        raise SwapklError(f"unknown default method set {kind!r} ({', '.join(DEFAULT_SETS)})")
    return tuple(s.name for s in specs() if kind in s.default_sets)


def run_order(names: Iterable[str]) -> list[str]:
    """``names`` with the guided methods first (their curves and the verdict come first), otherwise as given."""
    names = list(names)
    first = [n for n in names if (s := _REGISTRY.get(n)) is not None and s.guided]
    first.sort(key=lambda n: _REGISTRY[n].order)
    return first + [n for n in names if n not in first]


def default_seeds(chosen: Sequence[MethodSpec] = ()) -> list[int]:
    """Seeds a run uses when none are given: as many as the most-seeded chosen method runs."""
    return list(range(max([s.runs for s in chosen if s.seeded] or [DEFAULT_RUNS])))


def supports(name: str, unit: str) -> bool:
    """Whether method ``name`` removes ``unit`` (a group alias: every member does; an unknown name: False)."""
    check_unit(unit)
    members = GROUPS.get(name, (name,)) if name not in _REGISTRY else (name,)
    return all(m in _REGISTRY and unit in _REGISTRY[m].units for m in members)


def for_unit(names: Iterable[str], unit: str) -> list[str]:
    """The names of ``names`` (in their order) whose methods remove ``unit``."""
    return [n for n in names if supports(n, unit)]


def unit_methods(unit: str) -> tuple[str, ...]:
    """Every registered method that removes ``unit``, in display order."""
    check_unit(unit)
    return tuple(s.name for s in specs() if unit in s.units)


def refuse_other_units(names: Iterable[str], unit: str, offer: Iterable[str] | None = None) -> None:
    """Raise one :class:`~swapkl.errors.ContractError` line naming the methods of ``names`` that do not remove
    ``unit`` and the ones that do (``offer``: the choice to list, default :func:`unit_methods`)."""
    bad = [n for n in names if not supports(n, unit)]
    if bad:
        what = "remove whole blocks only" if all(find(n) is None or find(n).units == (BLOCK,) for n in bad) else \
            f"do not remove the {unit} unit"
        raise ContractError(f"method(s) {', '.join(bad)} {what}; for --unit {unit} choose from: "
                            f"{', '.join(unit_methods(unit) if offer is None else offer)}")


def calibration_methods() -> tuple[str, ...]:
    """Every registered method that reads calibration text, in display order."""
    return tuple(s.name for s in specs() if s.calibrated)


def calibration_params(calib_tokens: int | None, names: Iterable[str]) -> dict[str, dict]:
    """``{method: {"calib_tokens": N}}`` for every method of ``names`` (group aliases expanded) that reads
    calibration text: ``N = calib_tokens`` (a run's ``--calib-tokens``), else the method's registered default.
    The one mapping from a run's calibration count to the methods' parameters; merge it under any other
    per-method parameters.  ``calib_tokens`` below :data:`MIN_CALIB_TOKENS` raises :class:`SwapklError`."""
    if calib_tokens is not None and (isinstance(calib_tokens, bool) or not isinstance(calib_tokens, int)
                                     or calib_tokens < MIN_CALIB_TOKENS):
        raise SwapklError(f"--calib-tokens must be an integer of at least {MIN_CALIB_TOKENS} (got {calib_tokens!r})")
    out: dict[str, dict] = {}
    for raw in names:
        for name in GROUPS.get(raw, (raw,)) if raw not in _REGISTRY else (raw,):
            spec = _REGISTRY.get(name)
            if spec is not None and spec.calibrated:
                out[name] = {"calib_tokens": spec.calibration if calib_tokens is None else int(calib_tokens)}
    return out


def calib_tokens(ctx, name: str) -> int:
    """The calibration tokens method ``name`` reads in a run: ``ctx.params[name]["calib_tokens"]``, else its
    registered default (:attr:`MethodSpec.calibration`)."""
    given = ctx.param(name, "calib_tokens", None)
    return int(get(name).calibration if given is None else given)


def calibration_caption(method_info: dict) -> str | None:
    """The caption piece that states the calibration tokens each method of a run read (``method_info``:
    ``{method: {"settings": {"calib_tokens": N, ...}, ...}}``, as a curves result keeps it): ``"calibration 512
    tokens"`` when every calibrated method read the same count, else ``"calibration tokens: bi 2048, sleb 1024"``;
    None when no method read calibration text.  A value that is not a plausible count (a file from outside) is
    left out."""
    used = {m: (i.get("settings") or {}).get("calib_tokens") for m, i in (method_info or {}).items()
            if isinstance(i, dict) and isinstance(i.get("settings") or {}, dict)}
    used = {m: int(n) for m, n in used.items()
            if isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < 1e12 and n == int(n)}
    if not used:
        return None
    if len(set(used.values())) == 1:
        return f"calibration {next(iter(used.values()))} tokens"
    return "calibration tokens: " + ", ".join(f"{m} {n}" for m, n in used.items())


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


def declared(path: str | Path) -> list[dict] | None:
    """The ``METHODS`` literal of the module file ``path`` (read, not imported), or None when it has none."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "METHODS" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _register_declared(module: str, entries: list[dict]) -> None:
    for d in entries:
        d = dict(d)
        run, cost = d.pop("run"), d.pop("cost", None)
        register(**d, target=f"{module}:{run}", cost=f"{module}:{cost}" if cost else None)


def discover(*folders) -> list[str]:
    """Register the methods of every module of the package (each module's ``METHODS``, read without importing it;
    a module without one is imported and registers itself); returns the module names.  Runs when the package is
    imported.  ``folders``: more folders of method modules (a plugin directory, a test's temporary one), added to
    the package's ``__path__`` first; their modules import as ``swapkl.removal.methods.<name>``."""
    path = sys.modules[PACKAGE].__path__
    for folder in folders:
        if str(folder) not in path:
            path.append(str(folder))
    names = []
    for info in pkgutil.iter_modules(path):
        if info.name.startswith("_") or info.name in NOT_METHODS:
            continue
        module = f"{PACKAGE}.{info.name}"
        entries = declared(Path(info.module_finder.path) / f"{info.name}.py")
        if entries is None:
            importlib.import_module(module)
        else:
            _register_declared(module, entries)
        names.append(info.name)
    return names
