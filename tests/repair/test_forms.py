"""The bridge forms' registry: every form is a class found by file, the choices, the one refusal and the docs table
come from it, and the settings object refuses in one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from swapkl.errors import ContractError
from swapkl.repair import forms
from swapkl.repair.bridge import Bridge
from swapkl.repair.settings import BridgeSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "repair.md"


def test_the_registry_finds_every_form_file_and_the_default_comes_first():
    assert forms.NAMES == ("folded", "residual") and forms.DEFAULT == "folded"
    assert all(isinstance(f, forms.BridgeForm) for f in forms.REGISTRY.values())
    assert Bridge(1, 2, "residual", None).kind is forms.get("residual")
    with pytest.raises(ContractError, match="^unknown bridge form 'cubic'; choose one of: folded, residual$"):
        forms.get("cubic")


def test_what_differs_is_the_forms_own():
    folded, residual = forms.get("folded"), forms.get("residual")
    assert folded.exports and not residual.exports
    assert folded.fallback == "residual" and residual.fallback is None
    assert folded.captures(3) == {2} and residual.captures(3) == set()
    assert folded.params_added(8) == 0 and residual.params_added(8) == 64
    assert residual.export_refusal(Bridge(2, 4, "residual", None)).startswith("the bridge over layers 2..3")
    with pytest.raises(forms.NoExactFold, match="starts at block 0"):
        folded.check_start(0)


def test_the_docs_table_is_the_registrys():
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- forms-table -->\n", 1)[1].split("\n<!-- /forms-table -->", 1)[0]
    assert table == forms.table()


@pytest.mark.parametrize("fields,message", [
    ({"form": "diagonal"}, "unknown bridge form 'diagonal'"),
    ({"calib_tokens": 8}, "at least 16"),
    ({"calib_tokens": 64, "calib_window": 128}, r"--calib-tokens \(64\) must be at least the calibration window"),
    ({"ridge": float("inf")}, "ridge must be a finite number"),
    ({"rank": 2}, "unknown bridge setting"),
])
def test_settings_refuse_in_one_line(fields, message):
    with pytest.raises(ContractError, match=message) as e:
        BridgeSettings.from_dict(fields)
    assert "\n" not in str(e.value)
    assert BridgeSettings.from_dict(None) == BridgeSettings() == BridgeSettings.from_dict(BridgeSettings())
