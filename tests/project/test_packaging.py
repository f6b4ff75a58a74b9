"""What ``pip install swapkl`` gets: every third-party import of the library is declared in pyproject.toml, as a
core dependency or as an extra (``swapkl[tasks]``, ``swapkl[heal]``, ``swapkl[qlora]``); an extra is imported only
inside the functions that need it, after :func:`swapkl.errors.require_extra`, so a missing one is a one-line
"error: ... needs lm-eval: install swapkl[tasks]" (exit 2) instead of an ImportError; requirements.txt pins what
pyproject declares.  (.ci/wheel_check.sh installs the built wheel into a fresh virtual environment and runs it.)"""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from swapkl.errors import EXTRAS, MissingDependency, require_extra

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NOT_SHIPPED = ("dev", "all")  # extras that only gather others (and the test tools)
#: extras only the test suite needs, each built by its own CI script (no library feature: not in swapkl.errors.EXTRAS)
TEST_ONLY = {"llamacpp": ".ci/install_llamacpp.sh"}


def norm(name: str) -> str:
    """A distribution name as PEP 503 compares them (``PyYAML`` = ``pyyaml``, ``lm_eval`` = ``lm-eval``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(reqs) -> dict[str, Requirement]:
    """``{normalised name: Requirement}`` of requirement strings, swapkl's own extras (``swapkl[tasks]``) left out."""
    out = {}
    for r in map(Requirement, reqs):
        if norm(r.name) != "swapkl":
            out[norm(r.name)] = r
    return out


CORE = declared(PYPROJECT["dependencies"])
OPTIONAL = {extra: declared(reqs) for extra, reqs in PYPROJECT["optional-dependencies"].items()}
EXTRA_DISTS = {d for extra, reqs in OPTIONAL.items() if extra not in NOT_SHIPPED and extra not in TEST_ONLY for d in reqs}


def _walk(node, rel: str, func: str | None, out: list) -> None:
    for ch in ast.iter_child_nodes(node):
        if isinstance(ch, ast.Import):
            out.extend((a.name.split(".")[0], rel, ch.lineno, func) for a in ch.names)
        elif isinstance(ch, ast.ImportFrom) and ch.level == 0 and ch.module:
            out.append((ch.module.split(".")[0], rel, ch.lineno, func))
        _walk(ch, rel, ch.name if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)) else func, out)


def imports() -> list[tuple[str, str, int, str | None]]:
    """``(top-level module, file, line, enclosing function or None)`` of every absolute import in swapkl/."""
    out: list = []
    for path in sorted((ROOT / "swapkl").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        _walk(ast.parse(path.read_text(), rel), rel, None, out)
    return out


@functools.cache
def third_party() -> list[tuple[str, str, int, str | None]]:
    """:func:`imports` of modules outside the standard library and swapkl (scanned once per process, when a test
    first needs it: not while every worker collects)."""
    return [i for i in imports() if i[0] not in sys.stdlib_module_names and i[0] != "swapkl"]


@functools.cache
def installed() -> dict[str, list[str]]:
    """``{top-level module: [distributions]}`` of this environment."""
    return importlib.metadata.packages_distributions()


def dists_of(module: str) -> set[str]:
    """The distributions that provide top-level ``module`` (its own name when none is installed here)."""
    return {norm(d) for d in installed().get(module, [module])}


def test_the_scan_sees_the_imports_it_must():
    """The AST walk finds known imports at module level and inside functions (a scan that finds nothing would
    pass the tests below)."""
    found = {(m, f, fn) for m, f, _, fn in third_party()}
    assert ("scipy", "swapkl/evidence/sets.py", None) in found
    assert ("yaml", "swapkl/surgery/mergekit.py", None) in found
    assert ("lm_eval", "swapkl/measure/lmeval.py", "evaluate") in found
    assert ("peft", "swapkl/healing/train.py", "lora_model") in found
    assert dists_of("yaml") == {"pyyaml"} and dists_of("lm_eval") == {"lm-eval"}


def test_every_third_party_import_is_declared():
    undeclared = sorted({f"{m} ({f}:{line})" for m, f, line, _ in third_party()
                         if not dists_of(m) & (set(CORE) | EXTRA_DISTS)})
    assert not undeclared, f"imported by swapkl/ but not in pyproject.toml (core or an extra): {undeclared}"


def test_module_level_imports_are_core_dependencies():
    """What a module imports when it is imported must come with ``pip install swapkl`` itself."""
    bad = sorted({f"{m} ({f}:{line})" for m, f, line, func in third_party()
                  if func is None and not dists_of(m) & set(CORE)})
    assert not bad, f"imported at module level but only an extra (or undeclared): {bad}"


def test_the_extras_table_is_pyprojects():
    """swapkl.errors.EXTRAS (what require_extra checks) names the extras and distributions of pyproject."""
    for extra, modules in EXTRAS.items():
        assert extra in OPTIONAL, f"swapkl[{extra}] is not in pyproject's optional-dependencies"
        assert {norm(d) for d in modules.values()} == set(OPTIONAL[extra]), extra
        for module, dist in modules.items():
            assert norm(dist) in dists_of(module) or module not in installed(), (module, dist)
    shipped = {e for e in OPTIONAL if e not in NOT_SHIPPED and e not in TEST_ONLY}
    assert shipped == set(EXTRAS), "an extra of pyproject has no entry in swapkl.errors.EXTRAS (or the reverse)"
    for extra, script in TEST_ONLY.items():   # the script CI runs installs what the extra declares
        assert extra in OPTIONAL and all(d in (ROOT / script).read_text() for d in OPTIONAL[extra]), (extra, script)
    # "all" and "dev" gather the features (dev also the test tools)
    for extra in NOT_SHIPPED:
        assert any(norm(Requirement(r).name) == "swapkl" and {"tasks", "heal"} <= Requirement(r).extras
                   for r in PYPROJECT["optional-dependencies"][extra]), extra


def _guards(tree) -> set[str]:
    """Functions of a module that call ``require_extra`` themselves."""
    return {f.name for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(isinstance(c, ast.Call) and getattr(c.func, "id", getattr(c.func, "attr", None)) == "require_extra"
                    for c in ast.walk(f))}


def test_extras_are_imported_lazily_after_require_extra():
    """Every import of an extra-only module sits in a function that first calls require_extra (or a function of
    the same module that does), so the user gets the one-line message, never an ImportError."""
    extra_modules = {m for m, _, _, _ in third_party() if not dists_of(m) & set(CORE)}
    assert {"lm_eval", "peft"} <= extra_modules
    bad = []
    for path in sorted((ROOT / "swapkl").rglob("*.py")):
        tree = ast.parse(path.read_text())
        guards = _guards(tree)
        for f in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            imps = [n for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom)) and
                    any(name.split(".")[0] in extra_modules for name in
                        ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]))]
            if not imps:
                continue
            calls = [c.lineno for c in ast.walk(f) if isinstance(c, ast.Call) and
                     getattr(c.func, "id", getattr(c.func, "attr", None)) in guards | {"require_extra"}]
            if not calls or min(calls) > min(i.lineno for i in imps):
                bad.append(f"{path.relative_to(ROOT)}:{f.name}")
    assert not bad, f"an extra imported without require_extra first: {bad}"


def test_requirements_pin_what_pyproject_declares():
    """requirements.txt pins every core dependency and the extras the dashboard offers (tasks, heal) at versions
    pyproject accepts, and nothing pyproject does not declare; requirements-dev.txt likewise for dev."""
    def pins(name):
        lines = [ln.split("#")[0].strip() for ln in (ROOT / name).read_text().splitlines()]
        return {norm(r.name): r for r in (Requirement(ln) for ln in lines if ln and not ln.startswith("-r"))}

    req = pins("requirements.txt")
    assert set(CORE) <= set(req), f"core dependencies not pinned: {sorted(set(CORE) - set(req))}"
    allowed = set(CORE) | set(OPTIONAL["tasks"]) | set(OPTIONAL["heal"])
    assert set(req) <= allowed, f"pinned but not declared: {sorted(set(req) - allowed)}"
    assert set(OPTIONAL["tasks"]) | set(OPTIONAL["heal"]) <= set(req)
    for name, r in req.items():
        (version,) = [s.version for s in r.specifier if s.operator == "=="]
        spec = (CORE.get(name) or OPTIONAL["tasks"].get(name) or OPTIONAL["heal"].get(name)).specifier
        assert spec.contains(version), f"requirements.txt pins {name}=={version}, pyproject wants {spec}"
    dev = pins("requirements-dev.txt")
    assert set(dev) == set(OPTIONAL["dev"]), (sorted(dev), sorted(OPTIONAL["dev"]))
    for name, r in dev.items():
        exact = [s.version for s in r.specifier if s.operator == "=="]
        assert not exact or OPTIONAL["dev"][name].specifier.contains(exact[0]), name


# --------------------------------------------------------------------------------- a missing extra, as users meet it
@pytest.mark.parametrize("extra, module, what", [("tasks", "lm_eval", "lm-eval"), ("heal", "peft", "peft"),
                                                 ("qlora", "bitsandbytes", "bitsandbytes")])
def test_require_extra_names_the_extra(monkeypatch, extra, module, what):
    monkeypatch.setitem(sys.modules, module, None)  # import machinery: "not installed"
    with pytest.raises(MissingDependency) as e:
        require_extra(extra, "this feature")
    assert str(e.value) == f"this feature needs {what}: install swapkl[{extra}]"


def _cli(capsys, *argv) -> tuple[int, str]:
    from swapkl.commands.cli import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("module, argv, message", [
    ("lm_eval", ["tasks", "{m}", "--tasks", "hellaswag", "--budget", "1"],
     "error: task accuracy (lm-evaluation-harness) needs lm-eval: install swapkl[tasks]"),
    ("peft", ["heal", "{m}", "--removed", "1"], "error: swapkl heal needs peft: install swapkl[heal]"),
    ("lm_eval", ["heal", "{m}", "--removed", "1", "--tasks", "hellaswag"],
     "error: task accuracy (lm-evaluation-harness) needs lm-eval: install swapkl[tasks]"),
])
def test_a_missing_extra_is_one_line_at_the_command_line(monkeypatch, capsys, stories_path, tmp_path, module, argv,
                                                          message):
    """Before any model is loaded: exit 2 and the one line that says which extra to install."""
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, module, None)
    from swapkl.measure import lmeval

    monkeypatch.setattr(lmeval, "_MANAGERS", {})  # a task manager made earlier in this process is not used
    import swapkl.model.checkpoints as C

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the missing extra was reported")

    monkeypatch.setattr(C, "load_checkpoint", no_load)
    code, err = _cli(capsys, *[a.format(m=stories_path) for a in argv])
    assert code == 2 and err.strip().splitlines() == [message], err


def test_qlora_without_bitsandbytes_is_one_line(monkeypatch):
    from swapkl.healing import qlora

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    with pytest.raises(MissingDependency, match=r"^QLoRA \(4-bit base weights\) needs bitsandbytes: install "
                                                r"swapkl\[qlora\]$"):
        qlora.check_available(cuda=True)
