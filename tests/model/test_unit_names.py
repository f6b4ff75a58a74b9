"""The unit names (block, attention, mlp) are spelled in one module, :mod:`swapkl.contract`, with one validation
function and one message; every other module imports them."""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from swapkl import contract
from swapkl.contract import BLOCK, SUBLAYERS, UNITS, Contract, check_unit
from swapkl.errors import ContractError, SwapklError

ROOT = Path(__file__).resolve().parents[2]
DEFINING = Path("swapkl/contract.py")
NAMES = {"block", "attention", "mlp"}
MESSAGE = "unknown unit 'ffn'; choose one of: block, attention, mlp"


def spelled_lists(source: str) -> list[int]:
    """Line numbers of every tuple, list or set literal with two or more unit names among its elements, of every
    dict literal with two or more unit names among its keys, and of every string holding the unit message."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("unknown unit"):
            hits.append(node.lineno)
            continue
        else:
            continue
        names = [x.value for x in items if isinstance(x, ast.Constant) and x.value in NAMES]
        if len(names) >= 2:
            hits.append(node.lineno)
    return hits


def test_the_scan_finds_each_way_of_spelling_the_names():
    assert spelled_lists('x = ("block", "attention", "mlp")') == [1]
    assert spelled_lists('if u in ["attention", "mlp"]: pass') == [1]
    assert spelled_lists('d = {"attention": 1, "mlp": 2}') == [1]
    assert spelled_lists('raise E(f"unknown unit {u}")') == [1]
    # one name alone (a default, a comparison) and module paths that contain one name are not a list of units
    assert spelled_lists('unit = "block"\nif u == "attention": pass\nm = ("ln_2", "mlp")') == []
    assert spelled_lists('"""block, attention or mlp"""') == []  # prose in a docstring is not a literal list


def test_unit_names_are_spelled_only_in_the_contract():
    files = sorted((ROOT / "swapkl").rglob("*.py")) + sorted((ROOT / "pages").glob("*.py")) + [ROOT / "app.py"]
    found = {}
    for f in files:
        rel = f.relative_to(ROOT)
        if rel == DEFINING or not f.exists():
            continue
        lines = spelled_lists(f.read_text(encoding="utf-8"))
        if lines:
            found[str(rel)] = lines
    assert found == {}, f"unit names spelled outside {DEFINING} (import UNITS / SUBLAYERS / check_unit): {found}"
    assert spelled_lists((ROOT / DEFINING).read_text(encoding="utf-8")), "the contract defines them"


def test_the_names_and_their_order():
    assert BLOCK == "block" and SUBLAYERS == ("attention", "mlp") and UNITS == ("block", "attention", "mlp")


@pytest.mark.parametrize("bad", ["ffn", "", "Block", None, 3, ["mlp"]])
def test_check_unit_refuses_in_one_line(bad):
    with pytest.raises(ContractError) as e:
        check_unit(bad)
    assert str(e.value).startswith("unknown unit '") and "\n" not in str(e.value)
    assert str(e.value).endswith("; choose one of: block, attention, mlp")


def test_check_unit_returns_the_unit_and_takes_the_callers_error_type():
    for u in UNITS:
        assert check_unit(u) == u
    with pytest.raises(SwapklError, match=f"^curves file: {MESSAGE}$"):
        check_unit("ffn", lambda m: SwapklError(f"curves file: {m}"))
    with pytest.raises(ContractError) as e:
        check_unit("x" * 10_000)
    assert len(str(e.value)) < 120  # a name read from a file never floods the message


def test_every_layer_shows_the_same_message():
    from swapkl.schema import curves as schema_curves
    from swapkl.surgery.removal_set import PruneError, RemovalSet

    with pytest.raises(ContractError, match=f"^{MESSAGE}$"):
        Contract(unit="ffn")
    with pytest.raises(PruneError, match=f"^{MESSAGE}$"):
        RemovalSet([(1, "ffn")])
    with pytest.raises(schema_curves._Invalid, match=f"^unit: {MESSAGE}$"):  # the file's error names the field
        schema_curves._unit("ffn", "unit")
    assert schema_curves._unit("mlp", "unit") == "mlp"


def test_the_cli_offers_the_contract_units():
    from swapkl.commands.common import add_contract_args, add_unit_arg

    p = argparse.ArgumentParser()
    add_unit_arg(p)
    assert tuple(p._option_string_actions["--unit"].choices) == UNITS
    q = argparse.ArgumentParser()
    add_contract_args(q)
    assert q._option_string_actions["--unit"].metavar == "|".join(UNITS)


def test_the_model_layer_reexports_the_same_objects():
    units = pytest.importorskip("swapkl.model.units")
    assert units.check_unit is contract.check_unit and units.SUBLAYERS is SUBLAYERS and units.UNITS is UNITS
