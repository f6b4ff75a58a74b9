"""The Compare page (pages/compare.py) draws, with AppTest: two opened analyses side by side per protocol (A, B and
B − A as the library's figures hold them), the agreement table (the library's coefficients), the transfer table of an
uploaded comparison file, and the address bar holding the two analyses."""
from __future__ import annotations

import json

import pytest

from swapkl.compare.bundle import make_bundle
from swapkl.compare.result import CompareResult
from swapkl.scoring.results import matrix_json
from support.app_util import APP, TIMEOUT
from test_compare import synthetic


def test_the_compare_page_draws_both_protocols_and_the_agreement(cache):
    from streamlit.testing.v1 import AppTest

    from dashboard import common
    from swapkl.compare.agreement import rank_agreement

    a, b = synthetic(seed=0, noise=0.05), synthetic(seed=1, noise=0.05)
    m = common.manager()
    job_a = m.open_files(a.to_json().encode())
    job_b = m.open_files(json.dumps(make_bundle(b)).encode())  # B from a bundle: its caption is kept
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 2
    heat = charts[0]["data"]
    assert [t["name"] for t in heat[:3]] == ["A", "B", "B − A"]
    assert [t["customdata"][0] for t in heat[3:]] == [[0, 1]] * 3  # the clickable cells, one marker per pair
    assert heat[0]["z"] == matrix_json(job_a.result.replacement())  # by default A is the older, B the newer job
    assert heat[1]["z"] == matrix_json(job_b.result.replacement())
    assert heat[2]["z"] == matrix_json(job_b.result.replacement() - job_a.result.replacement())
    assert charts[1]["data"][0]["z"] == matrix_json(job_a.result.interchange())
    assert all("pairs all" in c["layout"]["meta"]["contract"] for c in charts)
    ag = rank_agreement(job_a.result, job_b.result)
    table = at.dataframe[0].value
    assert list(table["protocol"]) == ["replacement", "interchange"]
    assert table["Spearman ρ [95% CI]"][0].startswith(f"{ag['replacement']['spearman']['value']:.3f}")
    assert any("bundle computed on" in c.value for c in at.caption)
    assert any("opened from a file" in c.value for c in at.caption)  # no model here: the transfer needs the CLI
    assert at.query_params["a"] == job_a.key and at.query_params["b"] == job_b.key
    assert len(at.get("plotly_chart")) == 2  # no pair picked: no drill-down
    at.query_params["pair"] = "1-3"
    at.run()
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 4  # the drill-down of pair (1, 3): A's and B's per-prompt KLs
    assert charts[2]["data"][2]["y"] == pytest.approx(job_a.result.per_prompt["inter"][(1, 3)].tolist())
    assert charts[3]["data"][2]["y"] == pytest.approx(job_b.result.per_prompt["inter"][(1, 3)].tolist())


def test_the_address_bar_picks_the_analyses_and_a_different_depth_is_one_error(cache):
    from streamlit.testing.v1 import AppTest

    from dashboard import common

    m = common.manager()
    j6 = m.open_files(synthetic(seed=0).to_json().encode())
    j5 = m.open_files(synthetic(L=5).to_json().encode())
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["a"] = j6.key
    at.query_params["b"] = j5.key
    at.run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="cmp_a").value == 0 or at.selectbox(key="cmp_a").value == 1
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and "different depth" in errs[0] and "\n" not in errs[0]


def test_the_transfer_table_of_a_comparison_file_is_refused_for_other_models():
    from swapkl.jobs.comparisons import compare_jobs
    from swapkl.errors import SwapklError

    class J:
        def __init__(self, res, key):
            self.result, self.key, self.bundle = res, key, None
            self.request = type("R", (), {"label": lambda self: "req", "kind": "analysis"})()

    a, b = synthetic(seed=0, noise=0.05), synthetic(seed=1, noise=0.05)
    d = CompareResult(a={"model": {"display": "m0"}, "contract": a.contract},
                      b={"model": {"display": "m1", "num_layers": 6}, "contract": b.contract},
                      agreement=compare_jobs(J(a, "x"), J(b, "y")).agreement,
                      transfer={"baseline_ppl": 20.0, "n_windows": 8, "protocols": {"interchange": [{"n": 1, "set_a": [2], "set_b": [3], "diff": 1.5,
                                                               "ci": [0.5, 2.5], "word": "worse"}]}}).to_json()
    with pytest.raises(SwapklError, match="another model"):
        compare_jobs(J(a, "x"), J(synthetic(seed=1, noise=0.05), "y"), d.replace('"num_layers": 6', '"num_layers": 7'))
    out = compare_jobs(J(a, "x"), J(b, "y"), d)
    from swapkl.compare.figures import transfer_rows

    rows = transfer_rows(out)
    assert rows[0]["verdict"] == "worse" and rows[0]["set chosen on A"] == "[2]"


def test_the_transfer_request_of_two_computed_analyses():
    from swapkl.contract import Contract
    from swapkl.jobs.comparisons import transfer_request
    from swapkl.jobs.requests import AnalysisRequest

    class J:
        def __init__(self, res, model, key):
            self.result, self.key, self.bundle = res, key, None
            self.request = AnalysisRequest(model=model, contract=Contract.from_dict(res.contract), budget=2)

    a, b = synthetic(seed=0), synthetic(seed=1)
    req = transfer_request(J(a, "default", "k1"), J(b, "/tmp/ft", "k2"), 3)
    assert (req.model_a, req.model_b, req.budget, req.kind) == ("default", "/tmp/ft", 3, "compare")
    assert req.contract == Contract.from_dict(a.contract)
    from swapkl.compare.agreement import DepthMismatch

    with pytest.raises(DepthMismatch):
        transfer_request(J(a, "default", "k1"), J(synthetic(L=5), "x", "k3"), 3)


def test_a_clicked_cell_or_point_or_the_link_selects_the_drill_down_pair():
    from swapkl.views.links import selected_pair

    pairs = [[0, 1], [1, 2], [0, 2]]
    cell = {"selection": {"points": [{"x": 2, "y": 0, "z": 0.3}]}}
    point = {"selection": {"points": [{"x": 1.5, "y": 0.217, "customdata": [1, 2]}]}}
    assert selected_pair(cell, "1-2", pairs) == (0, 2)  # a click wins over the link
    assert selected_pair(point, None, pairs) == (1, 2)
    assert selected_pair({"selection": {"points": [{"x": 1.5, "y": 0.217}]}}, None, pairs) is None  # not a cell
    assert selected_pair(None, "2-1", pairs) == (1, 2)
    assert selected_pair(None, "0-9", pairs) is None and selected_pair(None, "x-y", pairs) is None
    assert selected_pair({"selection": {"points": []}}, None, pairs) is None
