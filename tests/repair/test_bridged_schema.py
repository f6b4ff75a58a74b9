"""A bridged swap-KL file round-trips, and a damaged one is refused in one line naming the problem."""
import copy
import json

import numpy as np
import pytest

from swapkl.contract import Contract
from swapkl.errors import UploadError
from swapkl.repair.bridged_kl import BridgeSettings, BridgedResult


def _result():
    c = Contract(prompts=3).to_dict()
    spans = {(1, 2): {"bridged": [0.1, 0.2, 0.3], "raw": [0.5, 0.4, 0.9], "fit": {"form": "folded", "eps": 0.01}},
             (2, 4): {"bridged": [1.0, 2.0, 3.0], "raw": [4.0, 5.0, 6.0], "fit": {"form": "residual"}}}
    return BridgedResult(4, spans, c, BridgeSettings().to_dict(), {"kind": "local", "id": "m"}, {"tokens": 8192})


def test_round_trip(tmp_path):
    res = _result()
    res.to_json(tmp_path / "b.json")
    back = BridgedResult.from_json(tmp_path / "b.json")
    assert back.spans == res.spans and back.settings == res.settings and back.num_layers == 4
    m = back.matrix()
    assert m[1, 2] == pytest.approx(0.2) and m[2, 4] == pytest.approx(2.0) and np.isnan(m[0, 1])
    rows = back.rows()
    assert [r["span"] for r in rows] == [[1, 2], [2, 4]] and rows[0]["raw"] == pytest.approx(0.6)


@pytest.mark.parametrize("damage,says", [
    (lambda d: d.update(format="swapkl.result/1"), "format is not swapkl.bridged/1"),
    (lambda d: d["spans"][0].update(span=[3, 2]), r"spans\[0\]\.span = \[3, 2\] is not a span"),
    (lambda d: d["spans"][1].update(span=[2, 5]), "outside 0..4"),
    (lambda d: d["spans"][0].update(raw=[0.1, 0.2]), "not one per prompt"),
    (lambda d: d["spans"][0]["bridged"].__setitem__(1, "x"), r"spans\[0\]\.bridged\[1\]"),
    (lambda d: d["spans"].append(copy.deepcopy(d["spans"][0])), "appears twice"),
    (lambda d: d["settings"].update(form="diagonal"), "settings.form"),
    (lambda d: d.update(extra=1), "not a known field"),
])
def test_damaged_files_are_refused(damage, says):
    d = json.loads(json.dumps(_result().to_dict()))
    damage(d)
    with pytest.raises(UploadError, match=says) as e:
        BridgedResult.from_dict(d)
    assert "\n" not in str(e.value)
