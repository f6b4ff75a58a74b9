"""Layer axes show only real layer indices, whatever the pair set: every heatmap (both protocols, the gap, the bridged
matrix, the comparison) fixes its axes to [-0.5, L-0.5] with integer ticks in 0..L-1, so the clickable cell markers
drawn on top cannot widen them (they did: -2..31 for a 30-layer model on adjacent pairs); the depth profile's ticks are
layer indices too; the HTML report and an exported figure carry the same axes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.scoring.results import SwapResult
from swapkl.views.links import add_cell_markers
from swapkl.views.scores import depth_profile, gap_heatmap, heatmaps, layer_ticks

CONTRACT = {"pairs": "adjacent", "prompts": 4, "tokens": 8}


def result(L: int, pairs: str = "adjacent") -> SwapResult:
    rng = np.random.default_rng(0)
    keys = [(i, i + 1) for i in range(L - 1)] if pairs == "adjacent" else [(i, j) for i in range(L) for j in range(i + 1, L)]
    vec = {k: {"repl_ij": rng.uniform(0.05, 1, 4), "repl_ji": rng.uniform(0.05, 1, 4), "inter": rng.uniform(0.01, 1, 4)}
           for k in keys}
    return SwapResult.from_pair_vectors(L, vec, contract=dict(CONTRACT, pairs=pairs), identity={"display": "m"},
                                        prompt_token_ids=[[1, 2]] * 4)


def layer_axes_of(fig) -> list[tuple]:
    lay = fig.to_plotly_json()["layout"]
    return [(k, lay[k]) for k in sorted(lay) if k.startswith(("xaxis", "yaxis"))]


def assert_real_layers(fig, L: int) -> None:
    axes = layer_axes_of(fig)
    assert axes
    for name, ax in axes:
        assert ax.get("autorange") is False, name
        lo, hi = sorted(ax["range"])
        assert (lo, hi) == (-0.5, L - 0.5), (name, ax["range"])
        assert ax["tickvals"] and all(isinstance(t, int) and 0 <= t <= L - 1 for t in ax["tickvals"]), name
        if name.startswith("yaxis"):
            assert ax["range"][0] > ax["range"][1]  # row 0 on top


@pytest.mark.parametrize("L,pairs", [(30, "adjacent"), (6, "all"), (40, "adjacent")])
def test_heatmap_axes_are_the_layer_indices(L, pairs):
    r = result(L, pairs)
    for fig in (add_cell_markers(heatmaps(r)), add_cell_markers(heatmaps(r, directed=True, scale="log")),
                add_cell_markers(gap_heatmap(r))):
        assert_real_layers(fig, L)
    assert layer_ticks(30) == list(range(30)) and layer_ticks(40)[-1] <= 39


def test_depth_profile_and_comparison_and_bridged_axes():
    from swapkl.compare.figures import side_by_side

    r = result(6, "all")
    assert_real_layers(side_by_side(r, r, "replacement"), 6)
    prof = depth_profile(result(30)).to_plotly_json()["layout"]["xaxis"]
    assert prof["range"] == [0, 29] and prof["tickvals"] == list(range(30))
    from swapkl.views.bridged import bridged_heatmaps

    bridged = {"spans": [{"span": [i, i + 1], "bridged": [0.1, 0.2], "raw": [0.3, 0.4]} for i in range(5)],
               "settings": {}, "calibration": {}}
    assert_real_layers(add_cell_markers(bridged_heatmaps(r, bridged, caption="c")), 6)


def test_the_report_and_an_exported_figure_carry_the_same_axes(tmp_path):
    from swapkl.views.report import build_report

    r = result(30)
    html = build_report(r)
    assert '"range":[-0.5,29.5]' in html.replace(" ", "") and '"range":[-2' not in html.replace(" ", "")
    exported = json.loads(add_cell_markers(heatmaps(r)).to_json())
    assert exported["layout"]["xaxis"]["range"] == [-0.5, 29.5]
    assert exported["layout"]["yaxis"]["range"] == [29.5, -0.5]
