"""Removal curves after a repair (swapkl/views/repaired.py): on a synthetic curves dict built to the data contract
(``repaired[method]`` entries = ``methods[method]``'s keys + ``paired_delta_pct`` / ``paired_ci``; ``repair`` =
{"kind", "settings", "fits"}), the dashed bridged traces carry the bridged ΔPPL values in the raw line's colour, the
table pairs raw and bridged per n with the tie words, and the caption names the form, tokens and ε."""
from __future__ import annotations

import copy

from swapkl.views import repaired as R
from swapkl.views.curves import removal_curves


def _entry(n, removed, delta, ci=None, **kw):
    ppl = 10.0 * (1 + delta / 100)
    return {"n": n, "removed": removed, "ppl": ppl, "ppl_ci": [ppl - 0.1, ppl + 0.1], "delta_pct": delta,
            "delta_pct_ci": ci or [delta - 1, delta + 1], "kl_to_base": 0.01 * n, **kw}


def synthetic_curves() -> dict:
    """Raw and bridged curves of two methods at n = 1, 2, as a repaired run records them (the contract)."""
    raw = {"replacement": [_entry(1, [3], 12.0), _entry(2, [3, 4], 30.0)],
           "interchange": [_entry(1, [5], 10.0), _entry(2, [2, 5], 25.0)]}
    bridged = {"replacement": [_entry(1, [3], 5.0, paired_delta_pct=-7.0, paired_ci=[-9.0, -5.0]),
                               _entry(2, [3, 4], 31.0, paired_delta_pct=1.0, paired_ci=[-0.5, 2.5])],
               "interchange": [_entry(1, [5], 11.5, paired_delta_pct=1.5, paired_ci=[0.5, 2.5]),
                               _entry(2, [2, 5], 20.0, paired_delta_pct=-5.0, paired_ci=None)]}
    fits = {"3-4": {"span": [3, 4], "form": "folded", "eps": 0.002, "ridge": 1e-4},
            "3-5": {"span": [3, 5], "form": "folded", "eps": 0.004, "ridge": 1e-4},
            "5-6": {"span": [5, 6], "form": "residual", "eps": 0.003, "ridge": 1e-4}}
    return {"model": {"display": "tiny", "num_layers": 8}, "evaluator": {"name": "tiny"}, "corpus": {"label": "wiki"},
            "budget": 2, "selection": {"spacing": 1}, "baseline_ppl": 10.0, "baseline_ppl_ci": [9.9, 10.1],
            "baseline": {}, "methods": raw, "repaired": bridged,
            "plan": {"repair": "bridge", "bridge": {"form": "folded", "calib_tokens": 4096}},
            "repair": {"kind": "bridge", "settings": {"form": "folded", "calib_tokens": 4096, "calib_window": 256,
                                                      "calib_seed": 0, "ridge": 1e-4}, "fits": fits}}


def test_bridged_curves_are_dashed_over_their_raw_ones_with_the_bridged_values():
    d = synthetic_curves()
    raw_fig = removal_curves(d)
    fig = R.with_bridged(raw_fig, d).to_plotly_json()
    lines = {t["meta"]["method"]: t for t in fig["data"] if isinstance(t.get("meta"), dict)
             and "method" in t["meta"] and "repair" not in t["meta"]}
    dashed = {t["meta"]["method"]: t for t in fig["data"] if isinstance(t.get("meta"), dict)
              and t["meta"].get("repair") == "bridged"}
    assert set(dashed) == {"replacement", "interchange"}
    for m, t in dashed.items():
        assert t["line"]["dash"] == "dash" and t["name"].endswith(" bridged")
        assert t["line"]["color"] == lines[m]["line"]["color"]
        assert list(t["x"]) == [1, 2] and list(t["y"]) == [e["delta_pct"] for e in d["repaired"][m]]
    assert len(raw_fig.data) == len(fig["data"]) - 2  # the raw figure is left as it was
    only = R.with_bridged(removal_curves(d, methods=["interchange"]), d, ["interchange"])
    assert [t.meta["method"] for t in only.data if (t.meta or {}).get("repair")] == ["interchange"]


def test_without_a_repair_nothing_changes():
    d = synthetic_curves()
    for k in ("repaired", "repair", "plan"):
        d.pop(k)
    fig = removal_curves(d)
    assert R.with_bridged(fig, d) is fig
    assert not len(R.repair_table(d)) and R.repair_caption(d) == ""
    assert R.curves_caption(d) == R.contract_caption(R.curves_provenance(d))


def test_the_table_pairs_raw_and_bridged_with_the_tie_words():
    d = synthetic_curves()
    t = R.repair_table(d)
    rows = {(r["method"], r["n"]): r for r in t.to_dict("records")}
    assert len(rows) == 4
    for m in ("replacement", "interchange"):
        for raw, br in zip(d["methods"][m], d["repaired"][m]):
            r = rows[(m, raw["n"])]
            assert (r["raw ΔPPL %"], r["bridged ΔPPL %"], r["bridged − raw (pp)"]) == (
                raw["delta_pct"], br["delta_pct"], br["paired_delta_pct"])
            lo_hi = br["paired_ci"]
            want = "–" if lo_hi is None else ("tie" if lo_hi[0] <= 0 <= lo_hi[1] else
                                              "bridged better" if lo_hi[1] < 0 else "bridged worse")
            assert r["verdict"] == want
    assert rows[("replacement", 2)]["verdict"] == "tie" and rows[("replacement", 1)]["verdict"] == "bridged better"
    assert rows[("interchange", 1)]["verdict"] == "bridged worse" and rows[("interchange", 2)]["95 % CI"] == ""
    assert rows[("replacement", 2)]["95 % CI"] == "[-0.50, 2.50]" and rows[("replacement", 2)]["removed"] == "3, 4"


def test_the_caption_names_the_repair():
    d = synthetic_curves()
    cap = R.repair_caption(d)
    assert cap.startswith("repair: linear bridge (folded, 4096 calibration tokens, window 256, seed 0, ridge 0.0001")
    assert "ε = ridge·tr(XᵀX)/d, 2.00e-03…4.00e-03 over 3 spans" in cap
    assert R.curves_caption(d).endswith(cap) and "wiki" in R.curves_caption(d)
    plan_only = copy.deepcopy(d)
    plan_only.pop("repair")  # a partial result before any fit: the plan's settings
    assert R.repair_caption(plan_only).startswith("repair: linear bridge (folded, 4096 calibration tokens, window "
                                                  "default")


def test_the_report_section_holds_the_table():
    d = synthetic_curves()
    html = R.repair_html(d, "cap")
    assert "After repair: raw vs bridged" in html and html.count("bridged better") == 1 and "tie" in html
    assert "repaired.csv" in html
    d.pop("repaired")
    assert R.repair_html(d, "cap") == ""


def _row(delta):
    return {"ppl": 10 * (1 + delta / 100), "ppl_ci": [9, 11], "delta_pct": {"value": delta, "ci": [delta - 1, delta + 1],
                                                                           "tie": False}}


def test_healed_stages_are_drawn_per_method_only_when_the_points_carry_them():
    hc = {"methods": {"replacement": [{"n": 1, "raw": _row(12.0), "bridged": _row(6.0), "healed": _row(2.5)},
                                      {"n": 2, "raw": _row(30.0), "bridged": _row(14.0), "healed": _row(5.0)}],
                      "interchange": [{"n": 1, "raw": _row(10.0), "bridged": _row(4.0), "healed": 1.0}]}}
    fig = R.healed_stages_figure(hc, "cap").to_plotly_json()
    traces = {(t["meta"]["method"], t["meta"]["stage"]): t for t in fig["data"] if isinstance(t.get("meta"), dict)}
    assert len(traces) == 6
    for (m, stage), t in traces.items():
        want = [e[stage]["delta_pct"]["value"] if isinstance(e[stage], dict) else e[stage] for e in hc["methods"][m]]
        assert list(t["y"]) == want and list(t["x"]) == [e["n"] for e in hc["methods"][m]]
        assert t["line"]["dash"] == R.STAGES[stage]
    assert traces[("replacement", "raw")]["line"]["color"] == traces[("replacement", "healed")]["line"]["color"]
    assert traces[("replacement", "raw")]["line"]["color"] != traces[("interchange", "raw")]["line"]["color"]
    assert fig["layout"]["meta"]["contract"] == "cap"
    plain = {"methods": {"replacement": [{"n": 1, "delta_pct": {"healed_vs_base": {"value": 3.0}}}]}}
    assert R.healed_stages_figure(plain) is None
    no_bridge = {"methods": {"replacement": [{"n": 1, "raw": _row(12.0), "bridged": None, "healed": _row(2.5)}]}}
    assert R.healed_stages_figure(no_bridge) is None  # without a repair the healed figure already shows both


def test_a_heals_repair_record_gives_the_stages_too():
    rows = {"raw": _row(12.0), "bridged": _row(6.0), "healed": _row(2.5)}
    e = {"n": 1, "repair": {"kind": "bridge", "eval": {"rows": rows}}}
    assert [R.stage_of(e, s) for s in R.STAGES] == [12.0, 6.0, 2.5]
    assert R.stage_of({"n": 1}, "raw") is None and R.stage_value(True) is None and R.stage_value("3") is None


def test_a_figure_that_draws_the_bridged_stage_is_known():
    import plotly.graph_objects as go

    fig = go.Figure([go.Scatter(x=[1], y=[2], meta={"method": "bi", "kind": "healed"})])
    assert not R.draws_bridged(fig)
    fig.add_trace(go.Scatter(x=[1], y=[3], meta={"method": "bi", "kind": "bridged"}))
    assert R.draws_bridged(fig)
