"""swapkl.views.bridged: the bridged heatmap beside both protocols on one colour scale, and the statement of which
protocol's best pair the bridge favours, on hand-made results whose answers are read off plain loops."""
from __future__ import annotations

import json

import numpy as np

from swapkl import views
from swapkl.scoring.results import SwapResult
from swapkl.views.bridged import best_pairs, bridge_favours

CONTRACT = {"pairs": "gap:2", "prompts": 2, "tokens": 8, "positions": "last", "corpus": None, "seed": 0,
            "dtype": "float32", "device": "cpu", "aggregation": "max", "corpus_label": "toy corpus"}
IDENTITY = {"kind": "local", "id": "/x/toy", "display": "toy-model", "fingerprint": "abcdef0123456789",
            "revision": None}
SETTINGS = {"form": "folded", "calib_tokens": 4096, "calib_window": 128, "calib_seed": 0, "ridge": 0.001}

# per pair: (repl_ij, repl_ji, inter) per-prompt KL (2 prompts), nats
PAIRS = {(0, 1): ([0.10, 0.30], [0.20, 0.20], [0.50, 0.70]),   # d_repl 0.2 (best), d_inter 0.6
         (1, 2): ([0.40, 0.40], [0.30, 0.50], [0.04, 0.12]),   # d_repl 0.4, d_inter 0.08 (best)
         (2, 3): ([0.90, 1.10], [0.60, 0.60], [0.30, 0.50]),   # d_repl 1.0, d_inter 0.4
         (0, 2): ([0.80, 0.80], [0.70, 0.90], [0.90, 1.10])}   # d_repl 0.8, d_inter 1.0
# adjacent pairs: no d_repl below 0.10 nats, d_inter 0.08 at (1, 2) is: the verdict is divergent, prefer interchange


def result(pairs=PAIRS) -> SwapResult:
    vec = {p: {"repl_ij": a, "repl_ji": b, "inter": c} for p, (a, b, c) in pairs.items()}
    return SwapResult.from_pair_vectors(4, vec, contract=dict(CONTRACT), identity=dict(IDENTITY))


def bridged_dict(bridged: dict, raw: dict) -> dict:
    """A BridgedResult's dict: spans with per-prompt bridged and raw KL, plus a span to the last block."""
    spans = [{"span": [i, j], "bridged": bridged[(i, j)], "raw": raw[(i, j)], "fit": {"form": "folded"}}
             for (i, j) in bridged]
    spans.append({"span": [1, 4], "bridged": [9.0, 9.0], "raw": [20.0, 20.0], "fit": {"form": "folded"}})
    return {"format": "swapkl.bridged/1", "num_layers": 4, "contract": dict(CONTRACT), "settings": dict(SETTINGS),
            "spans": spans}


BRIDGED = {(0, 1): [0.02, 0.04], (1, 2): [0.06, 0.08], (2, 3): [1.4, 1.6], (0, 2): [0.01, 0.03]}
RAW = {(0, 1): [0.5, 0.7], (1, 2): [0.9, 1.1], (2, 3): [2.0, 2.2], (0, 2): [3.0, 3.4]}


def test_three_heatmaps_share_one_colour_scale_over_all_three_matrices():
    fig = json.loads(views.bridged_heatmaps(result(), bridged_dict(BRIDGED, RAW)).to_json())
    heat = [t for t in fig["data"] if t["type"] == "heatmap"]
    assert [t["name"] for t in heat] == ["replacement", "interchange", "bridged"]
    assert all(t["coloraxis"] == "coloraxis" for t in heat)
    # plain reference: every finite value of the three matrices (d_repl = max of directed means)
    values = []
    for a, b, c in PAIRS.values():
        values += [max(sum(a) / 2, sum(b) / 2), sum(c) / 2]
    values += [sum(v) / 2 for v in BRIDGED.values()]  # span (1, 4) runs to the last block: not a pair, not drawn
    assert np.isclose(fig["layout"]["coloraxis"]["cmin"], min(values))
    assert np.isclose(fig["layout"]["coloraxis"]["cmax"], max(values))  # 1.5 nats: the bridged (2, 3)
    z = heat[2]["z"]
    assert np.isclose(z[2][3], 1.5) and z[3][2] is None and z[1][3] is None
    assert np.isclose(z[0][2], 0.02)
    assert "bridge: folded, 4096 calibration tokens (window 128, seed 0), ridge 0.001" in fig["layout"]["meta"]["contract"]


def test_the_statement_names_each_best_pair_and_the_pair_the_bridge_favours():
    res, br = result(), bridged_dict(BRIDGED, RAW)
    assert best_pairs(res, br) == {"replacement": (0, 1), "interchange": (1, 2), "bridged": (0, 2)}
    # bridged KL of the replacement-best (0, 1) is 0.03 < 0.07 of the interchange-best (1, 2)
    assert bridge_favours(res, br) == "replacement"
    line = views.bridge_statement(res, br)
    assert "replacement (0, 1) 0.2000 nats" in line and "interchange (1, 2) 0.0800 nats" in line
    assert "bridged (0, 2) 0.0200 nats" in line
    assert "favours the replacement-best pair" in line
    assert "the verdict's choice (prefer interchange) changes to replacement" in line
    flipped = {**BRIDGED, (0, 1): [0.2, 0.2]}
    assert bridge_favours(res, bridged_dict(flipped, RAW)) == "interchange"
    line = views.bridge_statement(res, bridged_dict(flipped, RAW))
    assert "favours the interchange-best pair" in line and "(prefer interchange) holds after the bridge" in line
    tied = {**BRIDGED, (0, 1): [0.06, 0.08]}
    line = views.bridge_statement(res, bridged_dict(tied, RAW))
    assert "favours neither" in line and "does not change the verdict's choice (prefer interchange)" in line
    same = {**PAIRS, (1, 2): ([0.1, 0.1], [0.1, 0.1], [0.04, 0.12])}  # (1, 2) best under both
    assert bridge_favours(result(same), br) == "same"
    assert "cannot change which protocol" in views.bridge_statement(result(same), br)
    tied_regime = {**PAIRS, (0, 1): ([0.05, 0.05], [0.05, 0.05], [0.5, 0.7])}  # both protocols below 0.10
    assert "verdict prefers either protocol" in views.bridge_statement(result(tied_regime), br)


def test_span_costs_give_the_bridged_and_the_unbridged_mean():
    br = bridged_dict(BRIDGED, RAW)
    b, r = views.span_costs(br, 0, 2)
    assert np.isclose(b, 0.02) and np.isclose(r, 3.2)
    assert views.span_costs(br, 1, 3) is None
