"""Linked views (swapkl.views.links, dashboard/linked.py): heatmap cells are clickable (a transparent marker per scored
cell, on its heatmap's axes), a click names its pair, a click on a removal curve names that method's removal set at
that n, and the set's layers are marked on heatmaps (row and column bands) and on the depth profile; on the dashboard
(AppTest on stories260K) a simulated cell or depth-profile click opens the Heatmaps page's drill-down on exactly that
pair, and a simulated curve-point click marks exactly that set's layers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl import views
from swapkl.views import links
from swapkl.removal.plan import RemovalPlan, RunHooks
from support.app_util import open_job_page, switch_page
from test_compare import synthetic


def _event(*points) -> dict:
    return {"selection": {"points": list(points), "point_indices": [], "box": [], "lasso": []}}


def _curves_dict(L: int = 6) -> dict:
    def e(n, removed, **kw):
        return {"n": n, "removed": removed, "ppl": 10.0 + n, "delta_pct": 5.0 * n, "delta_pct_ci": [1.0, 9.0 * n], **kw}
    return {"model": {"display": "m0", "num_layers": L}, "evaluator": {"name": "matched"}, "corpus": {"label": "t"},
            "budget": 2, "selection": {"spacing": 1}, "baseline_ppl": 10.0,
            "methods": {"replacement": [e(1, [3]), e(2, [1, 3])], "interchange": [e(1, [2]), e(2, [2, 4])],
                        "random": [e(1, None, delta_pct_min=1.0, delta_pct_max=9.0),
                                   e(2, None, delta_pct_min=2.0, delta_pct_max=19.0)]}}


def _trace_index(fig, method: str) -> int:
    return next(k for k, t in enumerate(fig.data) if isinstance(t.meta, dict) and t.meta.get("method") == method)


# ------------------------------------------------------------------------------------------- views.links
def test_cell_markers_cover_exactly_the_scored_cells_on_their_own_heatmap():
    res = synthetic(L=6, seed=0)
    fig = links.add_cell_markers(views.heatmaps(res))
    heat = [t for t in fig.data if t.type == "heatmap"]
    cells = [t for t in fig.data if t.name and t.name.endswith(" cells")]
    assert [t.name for t in cells] == [f"{h.name} cells" for h in heat]
    for h, c, m in zip(heat, cells, (res.replacement(), res.interchange())):
        want = {(i, j) for i in range(6) for j in range(6) if i != j and np.isfinite(m[i, j])}
        got = {tuple(cd) for cd in c.customdata}
        assert got == want
        assert [(y, x) for x, y in zip(c.x, c.y)] == [tuple(cd) for cd in c.customdata]  # row i = y, column j = x
        assert (c.xaxis, c.yaxis) == (h.xaxis or "x", h.yaxis or "y")
        assert c.marker.opacity < 0.05


def test_cell_markers_skip_blank_cells():
    import plotly.graph_objects as go

    z = [[None, 1.0, None], [1.0, None, 2.0], [None, 2.0, None]]
    fig = links.add_cell_markers(go.Figure(go.Heatmap(z=z, x=[0, 1, 2], y=[0, 1, 2], name="h")))
    assert sorted(tuple(cd) for cd in fig.data[1].customdata) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_a_click_names_its_pair_and_the_link_is_the_fallback():
    pairs = [(0, 1), (1, 2), (0, 2)]
    assert links.selected_pair(_event({"x": 2, "y": 0}), "1-2", pairs) == (0, 2)
    assert links.selected_pair(_event({"x": 1.5, "y": 0.2, "customdata": [2, 1]}), None, pairs) == (1, 2)
    band = {"x": 1.5, "y": 0.3, "curve_number": 0}  # a point with no pair before the one that names it
    assert links.selected_pair(_event(band, {"x": 0.5, "y": 0.1, "customdata": [0, 1]}), None, pairs) == (0, 1)
    assert links.selected_pair(_event({"x": 4, "y": 3}), None, pairs) is None  # not a scored pair
    assert links.selected_pair(None, "2-0", pairs) == (0, 2)
    assert links.selected_pair("junk", "a-b", pairs) is None


def test_depth_profile_points_carry_their_pair():
    res = synthetic(L=5, seed=0)
    adj = type(res).from_pair_vectors(5, {p: {"repl_ij": res.per_prompt["repl"][p], "repl_ji": res.per_prompt["repl"][p],
                                              "inter": res.per_prompt["inter"][p]} for p in [(i, i + 1) for i in range(4)]},
                                      contract=res.contract, prompt_token_ids=[[1, 2, 3]] * 6, identity={"display": "m"})
    fig = views.depth_profile(adj)
    lines = [t for t in fig.data if isinstance(t.meta, dict) and "protocol" in t.meta]
    assert len(lines) == 2
    for t in lines:
        assert [list(cd) for cd in t.customdata] == [[i, i + 1] for i in range(4)]
        assert list(t.x) == [i + 0.5 for i in range(4)]


@pytest.mark.parametrize("method,n", [("replacement", 1), ("replacement", 2), ("interchange", 2)])
def test_a_curve_click_names_that_methods_set_at_that_n(method, n):
    d = _curves_dict()
    fig = views.removal_curves(d)
    k = _trace_index(fig, method)
    sel = links.curve_point(fig, d, _event({"curve_number": k, "x": n, "y": 5.0 * n}))
    entry = next(e for e in d["methods"][method] if e["n"] == n)
    assert sel == {"method": method, "n": n, "removed": entry["removed"], "delta_pct": entry["delta_pct"],
                   "delta_pct_ci": entry["delta_pct_ci"]}
    text = links.removal_sentence(sel)
    assert method in text and f"n = {n}" in text and "{" + ", ".join(map(str, entry["removed"])) + "}" in text


def test_a_click_on_random_or_a_band_or_nothing_names_no_set():
    d = _curves_dict()
    fig = views.removal_curves(d)
    band = next(k for k, t in enumerate(fig.data) if t.name.endswith(" band"))
    assert links.curve_point(fig, d, _event({"curve_number": _trace_index(fig, "random"), "x": 1, "y": 5})) is None
    assert links.curve_point(fig, d, _event({"curve_number": band, "x": 1, "y": 5})) is None
    assert links.curve_point(fig, d, _event({"curve_number": 99, "x": 1, "y": 5})) is None
    assert links.curve_point(fig, d, _event()) is None and links.curve_point(fig, d, None) is None


@pytest.mark.parametrize("removed", [[3], [1, 3], [0, 2, 5]])
def test_marks_on_heatmaps_are_the_rows_and_columns_of_exactly_the_removed_layers(removed):
    base = views.heatmaps(synthetic(L=6, seed=0))
    fig = links.mark_layers(base, removed)
    got = links.marked_layers(fig)
    assert got["row"] == sorted(removed * 2) and got["column"] == sorted(removed * 2)  # both heatmaps
    assert got["band"] == []
    refs = {(s.xref, s.yref) for s in fig.layout.shapes if " layer " in (s.name or "")}
    assert refs == {("x", "y"), ("x2", "y2")}
    assert not links.marked_layers(base)["row"]  # the memoised figure is left as it was


def test_marks_on_the_depth_profile_are_bands_centred_on_the_removed_layers():
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[0.5, 1.5, 2.5], y=[1, 2, 3]))
    out = links.mark_layers(fig, [2, 1])
    assert links.marked_layers(out) == {"row": [], "column": [], "band": [1, 2]}
    assert [(s.x0, s.x1) for s in out.layout.shapes] == [(0.5, 1.5), (1.5, 2.5)]


# ------------------------------------------------------------------------------------------- the dashboard
@pytest.fixture(scope="module")
def stories_parts(stories_path, wikitext_path, tmp_path_factory):
    """A score result (gap:2) and guided removal curves (budget 2) of stories260K, and an adjacent-only result
    (computed under a private cache)."""
    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.removal.curves import removal_curves
    from swapkl.measure.evaluate import Evaluator
    from swapkl.scoring.corpora import from_file
    from swapkl.scoring.score import score

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWAPKL_CACHE", str(tmp_path_factory.mktemp("linked") / "cache"))
        return _compute_parts(load_checkpoint(str(stories_path), device="cpu"), from_file(wikitext_path), score,
                              Contract, removal_curves, Evaluator)


def _compute_parts(ck, corpus, score, Contract, removal_curves, Evaluator):
    res = score(ck, Contract(pairs="gap:2", prompts=3, tokens=12))
    adj = score(ck, Contract(pairs="adjacent", prompts=3, tokens=12))
    curves = removal_curves(ck.model, ck.tokenizer, {"replacement": res.replacement(), "interchange": res.interchange()}, RemovalPlan(budget=2, methods=["replacement", "interchange"], evaluator=Evaluator("tiny", 200, 128, 64)),
                            RunHooks(corpus=corpus, identity=ck.identity))
    return res, curves, adj


def _charts(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _drill_down(at, res) -> tuple[int, int, list]:
    """The drill-down's pair (its pickers and the address bar) and its figure's per-prompt replacement KLs."""
    i, j = at.selectbox(key="w_pair_i").value, at.selectbox(key="w_pair_j").value
    assert at.query_params["pair"] in (f"{i}-{j}", [f"{i}-{j}"])
    pair_fig = next(c for c in _charts(at) if any(t.get("type") == "box" for t in c["data"]))
    return i, j, pair_fig["data"][0]["y"]


def test_clicking_a_heatmap_cell_opens_the_drill_down_on_that_pair(cache, stories_parts):
    from dashboard import common

    res = stories_parts[0]
    job = common.manager().open_files(res.to_json().encode())
    at = open_job_page(job, "pages/heatmaps.py")
    assert _drill_down(at, res)[:2] == (0, 1)  # no click yet: the first pair
    hm = _charts(at)[0]
    cells = next(t for t in hm["data"] if t.get("name") == "interchange cells")
    assert (3, 1) in {tuple(cd) for cd in cells["customdata"]}
    for point, pair in (({"x": 1, "y": 3, "customdata": [3, 1], "curve_number": 3}, (1, 3)),   # a cell's marker
                        ({"x": 4, "y": 2, "curve_number": 0}, (2, 4))):                        # a bare cell
        at.session_state["hm_main"] = _event(point)
        at.run()
        assert not at.exception, at.exception
        i, j, per_prompt = _drill_down(at, res)
        assert (i, j) == pair
        assert per_prompt == pytest.approx(list(res.per_prompt["repl"][pair]))
    at.selectbox(key="w_pair_j").set_value(3).run()  # the pickers stay free after a click
    assert _drill_down(at, res)[:2] == (2, 3)
    at.session_state["hm_gap"] = _event({"x": 2, "y": 0, "curve_number": 0})  # the gap heatmap is linked too
    at.run()
    assert _drill_down(at, res)[:2] == (0, 2)


def test_clicking_a_depth_profile_point_opens_its_pair(cache, stories_parts):
    from dashboard import common

    adj = stories_parts[2]
    job = common.manager().open_files(adj.to_json().encode())
    at = open_job_page(job, "pages/heatmaps.py")
    at.session_state["hm_depth"] = _event({"x": 2.5, "y": 0.1, "customdata": [2, 3], "curve_number": 1})
    at.run()
    assert not at.exception, at.exception
    assert _drill_down(at, adj)[:2] == (2, 3)


def test_clicking_a_curve_point_marks_exactly_its_removed_layers(cache, stories_parts):
    from dashboard import common
    from swapkl.compare.bundle import make_bundle

    res, curves, _ = stories_parts
    job = common.manager().open_files(json.dumps(make_bundle(res, curves)).encode())
    at = open_job_page(job, "pages/curves.py")
    main = _charts(at)[0]
    n_before = len(_charts(at))
    picks = [(m, e["n"]) for m in ("interchange", "replacement") for e in curves.methods[m] if e.get("removed")]
    assert {m for m, _ in picks} == {"interchange", "replacement"}
    for method, n in (picks[-1], picks[0]):
        k = next(k for k, t in enumerate(main["data"]) if (t.get("meta") or {}).get("method") == method)
        at.session_state["cv_main"] = _event({"curve_number": k, "x": n, "y": 1.0})
        at.run()
        assert not at.exception, at.exception
        removed = next(e["removed"] for e in curves.methods[method] if e["n"] == n)
        marked = _charts(at)[1]  # the heatmaps, drawn under the curves with the set marked
        assert [t["type"] for t in marked["data"][:2]] == ["heatmap", "heatmap"]
        rows = [round((s["y0"] + s["y1"]) / 2) for s in marked["layout"]["shapes"] if s.get("name", "").endswith(" row")]
        cols = [round((s["x0"] + s["x1"]) / 2) for s in marked["layout"]["shapes"]
                if s.get("name", "").endswith(" column")]
        assert sorted(rows) == sorted(cols) == sorted(removed * 2)
        text = " ".join(c.value for c in at.caption)
        assert f"{method}-guided removal at n = {n}" in text and "{" + ", ".join(map(str, removed)) + "}" in text
        # the Heatmaps page and the Start page's lead figure show the same marks
        for page in ("pages/heatmaps.py", "app.py"):
            switch_page(at, page).run()
            assert not at.exception, at.exception
            hm = _charts(at)[0]
            assert sorted(round((s["x0"] + s["x1"]) / 2) for s in hm["layout"]["shapes"]
                          if s.get("name", "").endswith(" column")) == sorted(removed * 2), page
        at.switch_page("pages/curves.py").run()
    at.button(key="linked_clear").click().run()  # clear: no marks, and the stale selection does not bring them back
    assert not at.exception, at.exception
    assert len(_charts(at)) == n_before
    at.run()
    assert len(_charts(at)) == n_before
