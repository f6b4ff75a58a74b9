"""The map stays true: docs/architecture.md's package map names every package and every module of ``swapkl/``,
``dashboard/``, ``pages/`` and ``app.py``, and names nothing that does not exist.

The map is the table under "## Package map": one row per package (its first cell: `` `model/` ``, the root row
`` `swapkl/` ``, the dashboard's `` `pages/`, `app.py` `` and `` `dashboard/` ``), whose description names each module of the package in
backticks, bare (`` `checkpoints` ``), a sub-package with its slash (`` `methods/` ``) and a sub-package's module with
its folder (`` `methods/base` ``).  Any other backticked word of a description (a function ``score()``, a class
``SwapResult``, a command ``python -m swapkl``) is not read as a module."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
#: a backticked module reference: lowercase dotted-free words joined by slashes, an optional trailing slash
MODULE_REF = re.compile(r"^[a-z_][a-z0-9_]*(/[a-z_][a-z0-9_]*)*(/|\.js)?$")
#: the rows of top-level folders beside ``swapkl/`` (the dashboard)
TOP_LEVEL = ("pages/", "dashboard/")


def package_map(text: str) -> dict[str, set[str]]:
    """``{folder of the row (relative to the project): {module references of its description}}`` from the package
    map's table of ``text``.  The row of the root modules is ``swapkl``; the dashboard's rows are the top-level
    folders ``pages`` (`` `pages/`, `app.py` ``, naming ``app.py`` as ``../app``) and ``dashboard``."""
    section = text.split("## Package map", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        heads = re.findall(r"`([^`]+)`", cells[0])
        refs = {t for t in re.findall(r"`([^`]+)`", " | ".join(cells[1:])) if MODULE_REF.match(t)}
        if heads[0] == "swapkl/":
            folder = "swapkl"
        elif heads[0] in TOP_LEVEL:
            folder = heads[0].rstrip("/")
            refs |= {"../app" for h in heads[1:] if h == "app.py"}
        else:
            folder = "swapkl/" + heads[0].rstrip("/")
        out[folder] = out.get(folder, set()) | refs
    return out


def named_paths(rows: dict[str, set[str]]) -> set[str]:
    """The files (``.py``) and packages (``/``) the map names, as paths relative to the project."""
    out = set()
    for folder, refs in rows.items():
        out.add(folder + "/")
        for r in refs:
            p = str(Path(folder) / r.rstrip("/")).replace("pages/../", "")
            if r in TOP_LEVEL:  # a row's word for the other top-level folder of the dashboard
                out.add(r)
                continue
            if r.endswith(".js"):  # a script file the row names (a package's non-Python file)
                out.add(p)
                continue
            out.add(p + "/" if r.endswith("/") else p + ".py")
    return out


def existing_paths(root: Path = ROOT) -> set[str]:
    """Every module (``.py``) and package (``/``) of ``swapkl/``, ``dashboard/`` and ``pages/`` (a folder of page
    files, not a package), ``app.py``, and the dashboard's scripts (``.js``); a package's ``__init__.py`` is the
    package itself, but the root one (the version) is a module of its own."""
    out = {"app.py", "swapkl/", "pages/"} | {str(p.relative_to(root)) for p in (root / "dashboard").glob("*.js")}
    for top in ("swapkl", "dashboard", "pages"):
        for p in (root / top).rglob("*.py"):
            rel = p.relative_to(root)
            if p.name == "__init__.py" and rel.parent != Path("swapkl"):
                out.add(f"{rel.parent}/")
            else:
                out.add(str(rel))
    return out


def test_the_map_is_read_as_written():
    text = ("## Package map\n\n| package | what |\n|---|---|\n"
            "| `swapkl/` (root) | `errors` (the `SwapklError`), `schema/` (`schema/fields`), `score()`, `__init__` |\n"
            "| `removal/` | `methods/` (`methods/base`; `python -m swapkl`) |\n"
            "| `pages/`, `app.py` | `heatmaps` (panels in `dashboard/`) |\n| `dashboard/` | `common`, `live.js` |\n\n"
            "## Next\n| `views/` | `report` |\n")
    rows = package_map(text)
    assert rows == {"swapkl": {"errors", "schema/", "schema/fields", "__init__"}, "swapkl/removal": {
        "methods/", "methods/base"}, "pages": {"heatmaps", "dashboard/", "../app"}, "dashboard": {"common", "live.js"}}
    assert named_paths(rows) == {"swapkl/", "swapkl/errors.py", "swapkl/schema/", "swapkl/schema/fields.py",
                                 "swapkl/__init__.py", "swapkl/removal/", "swapkl/removal/methods/",
                                 "swapkl/removal/methods/base.py", "pages/", "pages/heatmaps.py", "app.py",
                                 "dashboard/", "dashboard/common.py", "dashboard/live.js"}


def test_every_module_is_on_the_map_and_the_map_names_only_modules():
    named = named_paths(package_map(DOC.read_text(encoding="utf-8")))
    have = existing_paths()
    assert "swapkl/heavy.py" in have and "dashboard/common.py" in have and "swapkl/removal/methods/" in have
    assert "pages/heatmaps.py" in have and "dashboard/live_progress.js" in have
    missing = sorted(have - named)
    assert not missing, ("modules docs/architecture.md does not name (add each to its package's row of the package "
                         f"map): {missing}")
    stale = sorted(named - have)
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
