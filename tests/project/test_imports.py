"""Module structure: every module imports, the import graph of the library and the dashboard (``swapkl/``,
``dashboard/``, ``pages/``, ``app.py``; top-level and deferred imports alike) has no cycle and goes downward only
(docs/architecture.md: the dashboard may import the library, never the reverse; within the dashboard, pages and
``app.py`` import the helper modules of ``dashboard/``, nothing imports a page, and the helpers that
``dashboard.common`` gathers never import it), ``pages/`` holds only the pages ``app.py`` registers, the torch-free modules stay
torch-free, no module, class or function grows past its size limit, the method registry lists methods without
importing them, and a new removal method is one file."""
from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import swapkl

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "swapkl"
#: the top-level names of the dashboard in the graph: its helper modules, its pages, its entry
DASHBOARD = ("dashboard", "pages", "app")

#: the modules that import torch at module level; every other module must import without it (the CLI's --help,
#: the method registry and the dashboard's first paint import them) and defers torch-based imports into functions
TORCH_MODULES = {"swapkl.model.architectures", "swapkl.model.units", "swapkl.model.checkpoints", "swapkl.scoring.engine",
                 "swapkl.scoring.kl", "swapkl.scoring.headkl", "swapkl.scoring.memory",
                 "swapkl.scoring.prompts", "swapkl.scoring.reference", "swapkl.scoring.score", "swapkl.scoring.slots",
                 "swapkl.scoring.calls", "swapkl.scoring.batching", "swapkl.scoring.definitions", "swapkl.scoring.weights", "swapkl.support.check", "swapkl.model.outputs",
                 "swapkl.model.families", "swapkl.model.user_family", "swapkl.model.discovery", "swapkl.model.handed", "swapkl.model.unit_discovery", "swapkl.model.layouts",
                 "swapkl.surgery.blocks", "swapkl.surgery.merge", "swapkl.surgery.prune", "swapkl.surgery.reload_form", "swapkl.surgery.skip", "swapkl.surgery.sublayer_export", "swapkl.measure.evaluate",
                 "swapkl.repair.bridge", "swapkl.repair.calibration", "swapkl.repair.sweep", "swapkl.repair.joint_kl", "swapkl.repair.bridged_kl", "swapkl.repair.export", "swapkl.healing.text", "swapkl.healing.train", "swapkl.healing.heal", "swapkl.healing.bridged"}
#: runs the CLI when imported
NOT_IMPORTABLE = {"swapkl.__main__"}

CLASS_LINES = 200
FUNCTION_LINES = 80
#: no module of the library or the dashboard over this many lines (no exceptions, like the two limits above)
MODULE_LINES = 400


def _modules(root: Path | None = None, dashboard: bool = True) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of ``swapkl/`` and, with ``dashboard``, of ``dashboard/``, ``pages/``
    and ``app.py`` (under ``root``, default: this checkout)."""
    root = root or ROOT
    files = sorted((root / "swapkl").rglob("*.py"))
    if dashboard:
        files += sorted((root / "dashboard").glob("*.py")) + sorted((root / "pages").glob("*.py")) + [root / "app.py"]
    out = {}
    for p in files:
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imported(mod: str, path: Path, node: ast.Import | ast.ImportFrom, known) -> list[str]:
    """The modules of the graph (``swapkl``, ``dashboard``, ``pages``, ``app``) one import statement loads (relative imports resolved; ``from swapkl import x`` is the
    submodule ``swapkl.x`` when there is one, else the package)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for n in names:
        if n.split(".")[0] not in ("swapkl", *DASHBOARD):
            continue
        while n not in known and "." in n:
            n = n.rsplit(".", 1)[0]
        if n != mod:
            out.append(n)
    return out


def import_graph(root: Path | None = None) -> dict[str, set[str]]:
    """Every import of a module of the library or the dashboard, at module level or inside a function:
    ``{module: {imported modules}}``."""
    mods = _modules(root)
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[mod].update(_imported(mod, path, node, mods))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (c := visit(w)):
                return c
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (c := visit(v)):
            return c
    return None


def cyclic_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more than one module (or a module that
    imports itself), each sorted; Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(swapkl.__path__, "swapkl.") if m.name not in NOT_IMPORTABLE]
    assert "swapkl.removal.methods.random" in names and "swapkl.commands.score" in names
    for name in names:
        importlib.import_module(name)


def test_find_cycle_reports_the_path():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"e"}, "f": {"a"}}
    assert cyclic_components(graph) == [["a", "b"], ["c", "d"], ["e"]]
    assert cyclic_components({"a": {"b"}, "b": set()}) == []


def test_import_graph_has_no_cycle():
    graph = import_graph()
    assert "swapkl.store" in graph["swapkl.model.gguf"]  # deferred and top-level imports both count
    assert "dashboard.common" in graph["app"] and "swapkl.jobs" in graph["dashboard.session"]  # the dashboard is graphed
    assert "dashboard.common" in graph["pages.heatmaps"]
    assert cyclic_components(graph) == [], "import cycles: " + "; ".join(
        " -> ".join(c) for c in [find_cycle({v: graph[v] & set(comp) for v in comp}) for comp in cyclic_components(graph)])


#: the import rule, top to bottom: a module imports only from its own package, the root modules and the tiers below
#: its own (the dashboard -- dashboard/, pages/ and app.py, one package here -- sits beside commands/, above jobs/).  Packages of
#: one tier do not import each other.
LAYERS = (("commands", "dashboard"), ("jobs",), ("study",), ("compare",), ("evidence", "healing"), ("views",), ("removal", "trajectory", "support"), ("measure",), ("repair",), ("scoring", "surgery"), ("model",), ("",))
#: ``python -m swapkl``: Python looks for it at the package root, and it only starts the CLI
ENTRY_POINT = "swapkl.__main__"


def package_of(mod: str) -> str:
    """The package of the layout a module belongs to (``""`` for the root modules: errors, contract, store, schema;
    ``"dashboard"`` for the dashboard: dashboard/, pages/ and app.py)."""
    parts = mod.split(".")
    if parts[0] in DASHBOARD:
        return "dashboard"
    tops = {p for tier in LAYERS for p in tier}
    return parts[1] if len(parts) > 1 and parts[1] in tops else ""


def tier_of(mod: str) -> int:
    return next(k for k, tier in enumerate(LAYERS) if package_of(mod) in tier)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the rule, as ``"a -> b"``."""
    bad = []
    for mod, deps in sorted(graph.items()):
        if mod == ENTRY_POINT:
            continue
        for dep in sorted(deps):
            same = package_of(dep) == package_of(mod)
            if not same and (tier_of(dep) < tier_of(mod) or (tier_of(dep) == tier_of(mod) and package_of(dep))):
                bad.append(f"{mod} -> {dep}")
            elif package_of(dep) == "jobs" and package_of(mod) not in ("jobs", "dashboard"):
                bad.append(f"{mod} -> {dep} (only jobs/ and the dashboard use the dashboard backend)")
    return bad


def test_imports_go_downward_only():
    assert upward_imports({"swapkl.scoring.engine": {"swapkl.removal.curves"}}) == [
        "swapkl.scoring.engine -> swapkl.removal.curves"]
    assert upward_imports({"swapkl.removal.curves": {"swapkl.trajectory.compute"}})  # one tier, two packages
    assert upward_imports({"swapkl.commands.score": {"swapkl.jobs"}})
    assert not upward_imports({"swapkl.views.scores": {"swapkl.scoring.results", "swapkl.contract"}})
    # the dashboard imports the library (jobs/ included), the library never imports the dashboard
    assert not upward_imports({"dashboard.common": {"swapkl.jobs", "swapkl.views"}, "app": {"dashboard.common", "swapkl.errors"}})
    assert upward_imports({"swapkl.jobs.manager": {"dashboard.session"}}) == ["swapkl.jobs.manager -> dashboard.session"]
    assert upward_imports({"swapkl.views.report": {"app"}}) and upward_imports({"dashboard.common": {"swapkl.commands.cli"}})
    bad = upward_imports(import_graph())
    assert not bad, "imports against the layer order (docs/architecture.md):\n" + "\n".join(bad)


def test_the_library_never_imports_the_dashboard():
    graph = import_graph()
    found = [f"{m} -> {d}" for m, deps in graph.items() if m.startswith("swapkl") for d in deps
             if d.split(".")[0] in DASHBOARD]
    assert not found, found


#: the module of the dashboard that gathers the shared helpers for the pages (``from dashboard import common``)
GATHERING = "dashboard.common"


def dashboard_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that breaks the dashboard's own rule, as ``"a -> b (why)"``: pages (``pages.*``) and the entry
    (``app``) are run by Streamlit and imported by nothing; the helper modules that :data:`GATHERING` gathers never
    import it (the pages and the panels do)."""
    gathered = {d for d in graph.get(GATHERING, ()) if d.startswith("dashboard.")}
    bad = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            if dep == "app" or dep.startswith("pages."):
                bad.append(f"{mod} -> {dep} (a page or the entry is run by Streamlit, never imported)")
            elif dep == GATHERING and mod in gathered:
                bad.append(f"{mod} -> {dep} (a helper module that {GATHERING} gathers never imports it)")
    return bad


def test_dashboard_helpers_import_the_library_and_each_other_never_a_page():
    graph = import_graph()
    assert "dashboard.session" in graph[GATHERING] and GATHERING in graph["dashboard.heal_panel"]
    assert not dashboard_imports({GATHERING: {"dashboard.session"}, "dashboard.session": {"swapkl.jobs"},
                                  "dashboard.heal_panel": {GATHERING, "dashboard.tasks_panel"},
                                  "pages.curves": {GATHERING, "dashboard.heal_panel"}, "app": {GATHERING}})
    assert dashboard_imports({GATHERING: {"dashboard.session"}, "dashboard.session": {GATHERING}}) == [
        f"dashboard.session -> {GATHERING} (a helper module that {GATHERING} gathers never imports it)"]
    assert dashboard_imports({"dashboard.linked": {"pages.heatmaps"}, "pages.curves": {"app"}}) == [
        "dashboard.linked -> pages.heatmaps (a page or the entry is run by Streamlit, never imported)",
        "pages.curves -> app (a page or the entry is run by Streamlit, never imported)"]
    bad = dashboard_imports(graph)
    assert not bad, "imports against the dashboard's rule (docs/architecture.md):\n" + "\n".join(bad)


def registered_pages(app_source: str) -> list[str]:
    """The page files ``app.py``'s ``st.navigation`` list registers (``st.Page(str(HERE / "pages" / "<name>.py"),
    ...)``), as ``pages/<name>.py``, in order."""
    return [f"pages/{n}.py" for n in re.findall(r'HERE / "pages" / "(\w+)\.py"', app_source)]


def first_call(body: list[ast.stmt]) -> str | None:
    """The dotted name of the first statement of ``body`` that is not a docstring or an import, when it is a bare
    call (``common.app_navigation()`` -> ``"common.app_navigation"``); else None."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return ast.unparse(node.value.func)
        return None
    return None


def test_pages_holds_only_the_pages_app_registers_and_each_hands_over_to_app_navigation_first():
    assert registered_pages('st.Page(str(HERE / "pages" / "heatmaps.py"), url_path="heatmaps"), '
                            'st.Page(str(HERE / "pages" / "compare.py"))') == ["pages/heatmaps.py", "pages/compare.py"]
    assert first_call(ast.parse('"""doc"""\nimport x\nfrom y import z\ncommon.app_navigation()\nst.title("A")').body) \
        == "common.app_navigation"
    assert first_call(ast.parse('import x\nst.title("A")\ncommon.app_navigation()').body) == "st.title"
    assert first_call(ast.parse('x = 1\ncommon.app_navigation()').body) is None
    app = (ROOT / "app.py").read_text(encoding="utf-8")
    pages = registered_pages(app)
    assert len(pages) == 6 and "pages/compare.py" in pages and "pages/study.py" in pages
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").iterdir() if p.name != "__pycache__")
    # Streamlit lists every file of pages/ as a page when it discovers the folder: a helper there becomes an address
    assert files == sorted(pages), f"pages/ holds only the pages app.py registers (helpers go to dashboard/): {files}"
    for page in pages:  # a fresh server's first visit may run the file without app.py: it hands over first
        assert first_call(ast.parse((ROOT / page).read_text(encoding="utf-8")).body) == "common.app_navigation", page


def test_no_library_module_imports_streamlit():
    found = []
    for mod, path in _modules(dashboard=False).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            found += [mod for n in names if n.split(".")[0] == "streamlit"]
    assert not found, f"streamlit is for dashboard/, pages/ and app.py only: {found}"


def test_registry_lists_methods_without_importing_them():
    code = ("import sys\n"
            "from swapkl.removal import methods as M\n"
            "names = [s.name for s in M.specs()]\n"
            "labels = [M.label(n) for n in names] + [M.get('sleb').description]\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('swapkl.removal.methods.'))\n"
            "print(len(names), 'torch' in sys.modules, loaded)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    n, torch_loaded, loaded = r.stdout.strip().split(" ", 2)
    assert int(n) >= 11 and torch_loaded == "False"
    assert loaded == "['swapkl.removal.methods.base', 'swapkl.removal.methods.registry']"


def _torch_after_import(modules) -> str:
    code = ("import importlib, sys\n"
            f"for m in {sorted(modules)!r}:\n"
            "    importlib.import_module(m)\n"
            "    if 'torch' in sys.modules:\n"
            "        print(m); break\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_cli_registry_and_plots_import_without_torch():
    first = _torch_after_import(["swapkl.commands.cli", "swapkl.removal.methods", "swapkl.views", "swapkl.jobs.defaults",
                                 "swapkl.jobs"])
    assert first == "", f"importing {first} loaded torch"


def test_only_the_torch_modules_import_torch():
    names = [m.name for m in pkgutil.walk_packages(swapkl.__path__, "swapkl.")
             if m.name not in TORCH_MODULES | NOT_IMPORTABLE]
    first = _torch_after_import(names)
    assert first == "", f"importing {first} loaded torch (defer its torch-based imports, or list it in TORCH_MODULES)"


def _sizes() -> dict[str, tuple[str, int]]:
    """``{qualified name: ("class" | "function", lines)}`` for every class and function of ``swapkl/``,
    ``dashboard/``, ``pages/`` and ``app.py``."""
    out = {}
    for mod, path in _modules().items():

        def walk(node, prefix):
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    q = f"{prefix}.{ch.name}"
                    out[q] = ("class" if isinstance(ch, ast.ClassDef) else "function", ch.end_lineno - ch.lineno + 1)
                    walk(ch, q)
        walk(ast.parse(path.read_text(encoding="utf-8")), mod)
    return out


def _oversized() -> dict[str, int]:
    return {q: n for q, (kind, n) in _sizes().items() if n > (CLASS_LINES if kind == "class" else FUNCTION_LINES)}


def _module_lines() -> dict[str, int]:
    """Lines of every module of ``swapkl/``, ``dashboard/``, ``pages/`` and ``app.py`` (relative paths)."""
    return {str(f.relative_to(ROOT)): len(f.read_text(encoding="utf-8").splitlines()) for f in _modules().values()}


def test_no_oversized_class_or_function():
    big = _oversized()
    assert not big, (f"over {CLASS_LINES} lines (class) / {FUNCTION_LINES} (function): {big}; split it into named "
                     "steps (small functions, or a class whose methods are the steps)")


def test_no_oversized_module():
    big = {f: n for f, n in _module_lines().items() if n > MODULE_LINES}
    assert not big, f"modules over {MODULE_LINES} lines: {big}; split by concern (docs/architecture.md)"


# ------------------------------------------------------------------------------------------ a new method is one file
METHOD_FILE = '''
"""Test baseline: remove the deepest n layers."""
from swapkl.removal.methods.base import MethodOutput

METHODS = [{"name": "reverse-depth", "run": "reverse_depth", "description": "remove the last n layers",
            "label": "deepest layers", "offered": True, "rule_candidates": False, "order": 90, "cost": "cost"}]


def _sets(num_layers, budget):
    return [list(range(num_layers - n, num_layers)) for n in range(1, budget + 1)]


def cost(spec, plan):
    return _sets(plan.num_layers, plan.budget)


def reverse_depth(ctx, budget):
    return MethodOutput(sets=_sets(ctx.num_layers, budget))
'''


@pytest.fixture
def plugin_method(tmp_path, monkeypatch):
    """``reverse-depth`` written as one file into a temporary folder and discovered by the registry."""
    from swapkl.removal import methods as M
    from swapkl.removal.methods import registry

    (tmp_path / "reverse_depth.py").write_text(textwrap.dedent(METHOD_FILE))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(M, "__path__", list(M.__path__))
    try:
        assert "reverse_depth" in M.discover(tmp_path)
        yield M
    finally:
        sys.modules.pop("swapkl.removal.methods.reverse_depth", None)


def test_new_method_is_one_file(plugin_method, stories, wikitext_path, cache_dir):
    from swapkl.removal import curves
    from swapkl.scoring.corpora import from_file
    from swapkl.measure.evaluate import Evaluator
    from swapkl.removal.plan import RemovalPlan, RunHooks

    M = plugin_method
    spec = M.get("reverse-depth")
    assert M.label("reverse-depth") == "deepest layers" and "reverse-depth" in M.offered()
    assert spec.runs == 0 and not spec.seeded and M.default_seeds([spec]) == list(range(M.DEFAULT_RUNS))
    L = stories.num_layers
    plan = RemovalPlan(budget=2, methods=["reverse-depth"], evaluator=Evaluator("tiny", 200, 128, 64), kl=False)
    assert plan.expected_evaluations(L) == 1 + 2  # the baseline + its two planned sets
    r = curves.removal_curves(stories.model, stories.tokenizer, None, plan, RunHooks(corpus=from_file(wikitext_path)))
    assert [e["removed"] for e in r.methods["reverse-depth"]] == [[L - 1], [L - 2, L - 1]]


if __name__ == "__main__":
    # `PYTHONPATH=. python3 tests/project/test_imports.py [ROOT]`: the import graph's cycles and the largest modules, classes
    # and functions against their limits (ROOT: another checkout's graph, e.g. a commit's `git archive`)
    if len(sys.argv) > 1:
        ROOT = Path(sys.argv[1]).resolve()
    g = import_graph(ROOT)
    comps = cyclic_components(g)
    print(f"import graph: {len(g)} modules ({sum(m.split('.')[0] in DASHBOARD for m in g)} of the dashboard), "
          f"{sum(map(len, g.values()))} imports, {len(comps)} cycles" + "".join(f"\n  cycle: {c}" for c in comps))
    print(f"modules (limit {MODULE_LINES} lines):")
    for f, n in sorted(_module_lines().items(), key=lambda x: -x[1])[:5]:
        print(f"  {n:4d}  {f}")
    sizes = _sizes()
    for kind, limit in (("class", CLASS_LINES), ("function", FUNCTION_LINES)):
        rows = sorted(((n, q) for q, (k, n) in sizes.items() if k == kind), reverse=True)
        print(f"{kind}es (limit {limit} lines):" if kind == "class" else f"{kind}s (limit {limit} lines):")
        for n, q in rows[:5]:
            print(f"  {n:4d}  {q}")
