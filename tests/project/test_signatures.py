"""No public function of ``swapkl/removal`` (and ``swapkl/measure``, which it measures with), ``swapkl/healing`` or
``swapkl/jobs`` takes more than 10 parameters: a removal run's settings travel as one :class:`~swapkl.removal.plan.RemovalPlan` and its run-time plumbing as one
:class:`~swapkl.removal.plan.RunHooks` (docs/architecture.md, "The walk of one budget").

Counted from the source (``ast``): positional and keyword parameters, ``self``/``cls`` of a method excluded;
``*args``/``**kwargs`` are not counted (a ``**`` catch-all is a named, validated set such as
``methods.register(**spec)``).  Public: a name without a leading underscore, at module level or a method of a
public class (``__init__`` included)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("swapkl/removal", "swapkl/measure", "swapkl/healing", "swapkl/jobs")
LIMIT = 10


def count(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args] + [x.arg for x in a.kwonlyargs]
    if method and names[:1] in (["self"], ["cls"]):
        names = names[1:]
    return len(names)


def public_functions(tree: ast.Module):
    """(qualified name, parameter count) of every public function and public method of a public class."""
    out = []

    def visit(body, prefix: str, method: bool) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_") or node.name == "__init__":
                    out.append((prefix + node.name, count(node, method)))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.", True)

    visit(tree.body, "", False)
    return out


def test_counter_counts_what_it_says():
    """The counter itself, on hand-written signatures (so the real check below can fail)."""
    src = '''
def f(a, b, /, c, d=1, *args, e, f=2, **kw): ...
def _private(a, b, c, d, e, f, g, h, i, j, k): ...
class Public:
    def __init__(self, a, b): ...
    def m(self, *, x, y): ...
    @classmethod
    def c(cls, a): ...
    def _hidden(self, a, b, c, d, e, f, g, h, i, j, k): ...
class _Hidden:
    def m(self, a, b, c, d, e, f, g, h, i, j, k): ...
'''
    assert dict(public_functions(ast.parse(src))) == {"f": 6, "Public.__init__": 2, "Public.m": 2, "Public.c": 1}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_public_function_takes_more_than_ten_parameters(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    long = [f"{f.relative_to(ROOT)}:{name} takes {n}"
            for f in files for name, n in public_functions(ast.parse(f.read_text(encoding="utf-8"))) if n > LIMIT]
    assert not long, ("public functions over the 10-parameter limit (group settings into RemovalPlan / RunHooks "
                      "or a settings object): " + "; ".join(long))
