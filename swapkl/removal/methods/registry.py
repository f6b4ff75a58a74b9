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

from swapkl.errors import SwapklError
from swapkl.removal.methods.base import DEFAULT_RUNS, MethodSpec

PACKAGE = "swapkl.removal.methods"
#: modules of the package that hold no methods
NOT_METHODS = ("base", "registry")

_REGISTRY: dict[str, MethodSpec] = {}
GROUPS: dict[str, tuple[str, ...]] = {}


#: the :class:`MethodSpec` fields :func:`register` takes as keywords (how a method is shown and run by default)
SPEC_KEYS = ("label", "runs", "offered", "default", "cli_default", "order", "style", "guided")


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
    a method is not offered in the dashboard nor run by default unless it says so); another key is refused."""
    bad = sorted(set(spec) - set(SPEC_KEYS))
    if bad:
        raise SwapklError(f"method {name}: unknown field(s) {', '.join(bad)}; known: {', '.join(SPEC_KEYS)}")
    fields = {"label": name, "runs": 0, "offered": False, "default": False, "cli_default": False, "order": 100,
              "style": None, "guided": False} | spec
    fields["label"] = fields["label"] or name

    def add(func_or_target):
        doc = "" if isinstance(func_or_target, str) else (func_or_target.__doc__ or "")
        _REGISTRY[name] = MethodSpec(name, func_or_target, tuple(needs), description or doc.strip(), rule_candidates,
                                     label=fields["label"], runs=int(fields["runs"]), offered=fields["offered"],
                                     default=fields["default"], cli_default=fields["cli_default"],
                                     order=fields["order"], style=fields["style"], guided=fields["guided"],
                                     cost_target=cost)
        if group:
            GROUPS[group] = tuple(dict.fromkeys(GROUPS.get(group, ()) + (name,)))
        return func_or_target

    if target is not None:
        add(target)
        return None
    return add


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
