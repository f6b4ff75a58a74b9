"""The common-x-axis view: each point's share of non-embedding parameters removed (from the curves' sizes), its
ΔPPL, and its measured speed-up, one trace per (unit, method)."""
from __future__ import annotations

import pytest

from swapkl.views.units import common_axis_figure, common_axis_rows


def _curves(unit, per_layer, removed_sets, deltas, gains=None):
    sizes = {"non_embedding": 1000, "block": [100] * 10, "attention": [40] * 10, "mlp": [60] * 10}
    entries = [{"n": k + 1, "removed": s, "ppl": 10 + d, "ppl_ci": None, "delta_pct": d, "delta_pct_ci": [0, 2 * d],
                "kl_to_base": 0.1} for k, (s, d) in enumerate(zip(removed_sets, deltas))]
    return {"model": {"num_layers": 10}, "evaluator": {"name": "tiny", "max_words": 1, "window": 8, "stride": 4},
            "budget": len(entries), "baseline_ppl": 10.0, "methods": {"replacement": entries}, "unit": unit,
            "sizes": sizes, "gains": gains or {}}


def test_rows_and_figure():
    g = {"sets": {"3": {"prefill_speedup": 1.2, "decode_speedup": 1.1, "memory_ratio": 0.9}},
         "points": {"replacement": {"1": "3"}}}
    blocks = _curves("block", 100, [[3], [3, 5]], [1.0, 3.0], g)
    att = _curves("attention", 40, [[2], [2, 4], [2, 4, 6]], [0.2, 0.5, 1.5])
    rows = common_axis_rows([blocks, att])
    by = {(r["unit"], r["n"]): r for r in rows}
    assert by[("block", 2)]["params_removed_pct"] == pytest.approx(20.0)
    assert by[("attention", 3)]["params_removed_pct"] == pytest.approx(12.0)
    assert by[("block", 1)]["prefill_speedup"] == 1.2 and by[("attention", 1)]["prefill_speedup"] is None
    fig = common_axis_figure([blocks, att])
    names = [t.name for t in fig.data]
    assert names == ["block: replacement-guided", "attention: replacement-guided"]
    assert list(fig.data[1].x) == pytest.approx([0.0, 4.0, 8.0, 12.0])
    assert list(fig.data[0].y) == [0.0, 1.0, 3.0]
    assert fig.data[1].line.dash == "dash"
    sp = common_axis_figure([blocks, att], axis="speedup")
    assert [t.name for t in sp.data] == ["block: replacement-guided"] and list(sp.data[0].x) == [1.0, 1.2]
    assert "units: attention, block" in fig.layout.meta["contract"]


def test_report_shows_cost_vs_gain():
    from swapkl.removal.curves import CurvesResult
    from swapkl.views.report import build_report

    g = {"sets": {"3": {"prefill_speedup": 1.25, "decode_speedup": 1.125, "memory_ratio": 0.875}},
         "points": {"replacement": {"1": "3"}}, "settings": {"device": "cpu", "dtype": "float32", "context": 64,
                                                           "decode_tokens": 8, "runtime": "skipping"}}
    d = _curves("attention", 40, [[3], [3, 5]], [1.0, 3.0], g)
    d.update({"baseline_ppl_ci": [9.0, 11.0], "baseline": {}, "corpus": {}, "selection": {}})
    html = build_report(curves=CurvesResult.from_dict(d))
    assert "Cost vs gain (measured)" in html and "1.250" in html and "0.875" in html
    assert "Cost vs gain" not in build_report(curves=CurvesResult.from_dict(dict(d, gains={})))
