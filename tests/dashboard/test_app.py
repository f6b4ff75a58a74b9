"""AppTest tests of every dashboard page: set the widgets, compute on tests/fixtures/models/stories260K, and assert
that what is drawn holds the library's numbers (figure specs, tables, metrics), plus the error path and the
cached render read from its snapshot."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from streamlit.testing.v1 import AppTest

from support.app_util import APP, ROOT, STORIES_REL, TIMEOUT


def _manager():
    from dashboard import common

    return common.manager()


def _nan_to_none(m):
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in np.asarray(m, float)]


def _spec(chart) -> dict:
    return json.loads(chart.proto.spec)


def _charts(at) -> list[dict]:
    """The plotly figures drawn on the page, in order, as figure JSON dicts."""
    return [_spec(c) for c in at.get("plotly_chart")]


def _choose_stories(at, pairs="gap:2", budget=2):
    at.run()
    assert not at.exception
    at.radio(key="w_source").set_value("Local folder").run()
    at.selectbox(key="w_local").set_value(STORIES_REL)
    at.number_input(key="w_prompts").set_value(4)
    at.number_input(key="w_tokens").set_value(16)
    at.number_input(key="w_budget").set_value(budget)
    at.selectbox(key="w_pairs").set_value(pairs)
    at.run()
    return at


def _compute(at):
    at.button(key="compute").click().run()
    assert not at.exception, at.exception
    job = _manager().get(at.session_state["job_analysis"])
    if job.running:   # the page answered while the job computes in the background, with a live progress line
        live = at.get("bidi_component")
        assert len(live) == 1 and job.key in str(live[0].proto), [str(x.proto)[:300] for x in live]
        assert any(b.label == "Cancel" for b in at.button)
    assert job.wait(180), job.summary()
    at.run()
    assert not at.exception, at.exception
    return job


def test_start_page_defaults_and_contract_visible(cache):
    from swapkl.jobs.defaults import DEFAULT_BUDGET, default_contract

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    c = default_contract("auto")
    assert at.radio(key="w_source").value.startswith("Built-in default")
    assert at.number_input(key="w_prompts").value == c.prompts
    assert at.number_input(key="w_tokens").value == c.tokens
    assert at.number_input(key="w_budget").value == DEFAULT_BUDGET
    line = at.code[0].value
    assert line.startswith("default · pairs adjacent") and f"{c.prompts} prompts × {c.tokens} tokens" in line
    assert "evaluator quick" in line or "evaluator matched" in line


def test_compute_stories_all_pages(cache):
    from swapkl.scoring.score import score
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.contract import Contract
    from swapkl import views as plots
    from swapkl.scoring.verdict import regime_verdict

    at = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT))
    assert "pairs gap:2 · 4 prompts × 16 tokens" in at.code[0].value
    job = _compute(at)
    assert job.status == "done", job.error
    res, curves = job.result, job.curves

    # the library, called directly on the same contract, gives the same matrices (served from the score cache)
    ck = load_checkpoint(str(ROOT / STORIES_REL), device="cpu")
    direct = score(ck, Contract(pairs="gap:2", prompts=4, tokens=16, device="cpu"))
    np.testing.assert_allclose(res.replacement(), direct.replacement(), equal_nan=True)

    # Start page: more than adjacent pairs, so it leads with the heatmaps; verdict, best pairs and gap
    # statistics are the library's
    assert _charts(at)[0]["data"][1]["z"] == _nan_to_none(res.interchange())
    verdict = regime_verdict(res.replacement(), res.interchange())
    assert any(md.value == f"### {verdict['regime']} — prefer {verdict['prefer']}" for md in at.markdown)
    s = res.summary()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["mean"] == f"{s['gap']['mean']:.4g}" and metrics["max"] == f"{s['gap']['max']:.4g}"
    bp = s["replacement"]["best_pair"]
    assert metrics["best replacement pair"] == f"{bp[0]}-{bp[1]}"
    assert any("Done" in x.value for x in at.success)

    # Heatmaps page: the figure holds the replacement and interchange matrices, NaN = blank (null)
    at.switch_page("pages/heatmaps.py").run()
    assert not at.exception, at.exception
    figs = _charts(at)
    hm = figs[0]
    assert hm["data"][0]["z"] == _nan_to_none(res.replacement())
    assert hm["data"][1]["z"] == _nan_to_none(res.interchange())
    assert hm["data"][0]["z"][0][4] is None                       # pair (0, 4) not in gap:2 -> blank, not 0
    assert hm["data"][0]["coloraxis"] == hm["data"][1]["coloraxis"] == "coloraxis"   # one shared scale
    assert hm["layout"]["meta"]["contract"] == plots.contract_caption(res)
    gap = figs[1]
    assert gap["data"][0]["z"] == _nan_to_none(res.gap()) and gap["data"][0]["zmid"] == 0
    # directed matrix and log scale on demand
    at.toggle(key="w_hm_directed").set_value(True)
    at.radio(key="w_hm_scale").set_value("log").run()
    hm = _charts(at)[0]
    R = res.replacement_directed()
    expect = np.where(np.isfinite(R), np.log10(np.maximum(R, plots.LOG_FLOOR)), np.nan)
    np.testing.assert_allclose(np.array(hm["data"][0]["z"], dtype=float), expect, equal_nan=True)
    # pair drill-down: the per-prompt vectors of pair (1, 3)
    at.selectbox(key="w_pair_i").set_value(1).run()
    at.selectbox(key="w_pair_j").set_value(3).run()
    pd_fig = _charts(at)[2]
    assert at.query_params["pair"] in ("1-3", ["1-3"])              # a shareable link to the drill-down
    assert pd_fig["data"][0]["y"] == pytest.approx(list(res.per_prompt["repl"][(1, 3)]))
    assert pd_fig["data"][2]["y"] == pytest.approx(list(res.per_prompt["inter"][(1, 3)]))
    # top-k table = the library's table
    top = at.dataframe[0].value
    ref = plots.top_pairs_table(res, min(10, len(res.pairs)))
    assert list(top["repl_pair"]) == list(ref["repl_pair"]) and list(top["disagree"]) == list(ref["disagree"])
    assert list(top["d_inter"]) == pytest.approx(list(ref["d_inter"]))

    # Removal curves page: the ΔPPL curves, removed layers and KL to base are the CurvesResult's
    at.switch_page("pages/curves.py").run()
    assert not at.exception, at.exception
    figs = _charts(at)
    lines = {t["meta"]["method"]: t for t in figs[0]["data"] if isinstance(t.get("meta"), dict) and "method" in t["meta"]}
    assert set(lines) == {"replacement", "interchange", "random"}
    for m in lines:
        assert lines[m]["y"] == pytest.approx([e["delta_pct"] for e in curves.methods[m]])
    bands = [t for t in figs[0]["data"] if t.get("name", "").endswith(" band")]
    assert bands                                                    # CI bands on by default
    removed = at.dataframe[0].value
    ref = plots.removed_layers_table(curves)
    assert list(removed["replacement"]) == list(ref["replacement"])
    kl = {t["meta"]["method"]: t["y"] for t in figs[1]["data"]}
    assert kl["interchange"] == pytest.approx([e["kl_to_base"] for e in curves.methods["interchange"]])
    # baselines toggle off
    at.multiselect(key="w_cv_methods").set_value(["replacement", "interchange"])
    at.toggle(key="w_cv_bands").set_value(False).run()
    data = _charts(at)[0]["data"]
    assert {t["meta"]["method"] for t in data if isinstance(t.get("meta"), dict) and "method" in t["meta"]} == \
        {"replacement", "interchange"}
    assert not [t for t in data if t.get("name", "").endswith(" band")]
    # export a pruned model: it reloads with one layer fewer
    at.selectbox(key="w_exp_method").set_value("replacement").run()
    out = cache / "pruned"
    [t for t in at.text_input if t.label == "output folder"][0].set_value(str(out))
    at.button(key="export").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    import transformers as tf

    reloaded = tf.AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.config.num_hidden_layers == 5 - len(curves.methods["replacement"][0]["removed"])

    # downloads carry the contract
    from dashboard import common

    payload = common.result_json(job)
    assert payload["result"]["contract"]["pairs"] == "gap:2" and payload["curves"]["budget"] == 2
    csv = plots.table_csv(res.pair_table(), plots.contract_caption(res))
    assert csv.startswith("# contract: ") and "4 prompts × 16 tokens" in csv.splitlines()[0]


def test_error_path_and_recovery(cache, tmp_path):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.radio(key="w_source").set_value("Local folder").run()
    at.selectbox(key="w_local").set_value("other path…").run()
    at.text_input(key="w_local_other").set_value(str(tmp_path / "no-such-model")).run()
    at.button(key="compute").click().run()
    assert not at.exception
    errs = [e.value for e in at.error]
    assert errs and "no such file or folder" in errs[0] and "\n" not in errs[0]
    # the app keeps working: an unsupported architecture is a readable error too.  The app's first run started its
    # warm-up thread, which may still be importing transformers (when this test is the process's first): resolve
    # transformers' lazy attributes under swapkl.heavy's lock, as the app's own threads do, not racing it
    from swapkl import heavy

    with heavy.exclusive():

        from swapkl.model.tiny import tiny_model

        tiny_model("hrm_text").save_pretrained(tmp_path / "opt")  # its block lists run in loops: refused
    at.text_input(key="w_local_other").set_value(str(tmp_path / "opt")).run()
    at.button(key="compute").click().run()
    job = _manager().get(at.session_state["job_analysis"])
    assert job.wait(60)
    at.run()
    assert any("unsupported architecture: hrm_text" in e.value for e in at.error)
    # other pages show the failed job without crashing
    at.switch_page("pages/heatmaps.py").run()
    assert not at.exception and any("unsupported architecture" in e.value for e in at.error)


def test_cached_result_renders_fast_and_is_shared(cache):
    import streamlit as st

    at = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT), pairs="adjacent", budget=0)
    first = _compute(at)
    assert first.status == "done" and not first.from_snapshot
    # a second tab with the same settings sees the same job without pressing anything
    tab2 = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT), pairs="adjacent", budget=0)
    assert tab2.session_state["job_analysis"] == first.key and any("Done" in s.value for s in tab2.success)
    # a restarted server (new job manager): the cached result is read from its snapshot, not computed again
    # (how long that takes: benchmarks/timings.py)
    _manager().shutdown()
    st.cache_resource.clear()
    at2 = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT), pairs="adjacent", budget=0)
    at2.button(key="compute").click().run()
    assert not at2.exception
    job = _manager().get(at2.session_state["job_analysis"])
    assert job.from_snapshot and job.status == "done"
    assert any("loaded from the cache" in s.value for s in at2.success)
    assert any(m.label == "median" for m in at2.metric)
    # adjacent pairs only: the first view leads with the depth profile (not two blank heatmaps), holding the
    # result's d_repl / d_inter per adjacent pair; the settings fold away once a result shows
    figs = _charts(at2)
    assert "layer depth" in figs[0]["layout"]["title"]["text"]
    lines = {t["meta"]["protocol"]: t["y"] for t in figs[0]["data"] if "protocol" in (t.get("meta") or {})}
    res = job.result
    assert lines["interchange"] == pytest.approx([res.interchange()[i, i + 1] for i in range(4)])
    assert lines["replacement"] == pytest.approx([res.replacement()[i, i + 1] for i in range(4)])
    assert not at2.expander[0].proto.expanded
    at2.switch_page("pages/heatmaps.py").run()
    # heatmaps, gap, the depth profile (adjacent pairs only: its points open the drill-down) and the drill-down
    assert [c.key for c in at2.get("plotly_chart")] == ["hm_main", "hm_gap", "hm_depth", "hm_pair"]


def test_trajectory_page(cache, tmp_path, stories_path):
    from swapkl import views as plots

    folder = tmp_path / "run"
    for step in (0, 50):
        shutil.copytree(stories_path, folder / f"checkpoint-{step}")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/trajectory.py").run()
    assert not at.exception
    at.text_area(key="w_tr_list").set_value(str(folder))
    at.number_input(key="w_tr_prompts").set_value(3)
    at.number_input(key="w_tr_tokens").set_value(12)
    at.number_input(key="w_tr_k").set_value(2).run()
    assert "pairs gap:2" in at.code[0].value
    at.button(key="compute_traj").click().run()
    job = _manager().get(at.session_state["job_trajectory"])
    assert job.wait(180) and job.status == "done", job.error
    at.run()
    assert not at.exception, at.exception
    stats = job.trajectory.summary()
    figs = _charts(at)
    gap = figs[0]
    by_name = {t["name"]: t for t in gap["data"]}
    assert by_name["mean"]["x"] == [0, 50]
    assert by_name["mean"]["y"] == pytest.approx(list(stats["gap_mean"]))
    assert by_name["p75"]["y"] == pytest.approx(list(stats["gap_p75"]))
    pear = figs[2]["data"][0]["y"]
    assert pear == pytest.approx(list(stats["pearson"]))
    depth = figs[3]["data"][0]
    d = job.trajectory.depth()
    assert depth["x"] == pytest.approx(list(d["depth"])) and depth["y"] == pytest.approx(list(d["gap"]))
    table = at.dataframe[0].value
    assert list(table["gap_median"]) == pytest.approx(list(stats["gap_median"]))
    assert plots.contract_caption(job.trajectory) in figs[0]["layout"]["meta"]["contract"]


def test_demo_report_download(cache):
    from dashboard import common

    at = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT), pairs="adjacent", budget=0)
    job = _compute(at)
    labels = [b.label for b in at.get("download_button")]
    assert "⬇ Demo report (HTML)" in labels and "⬇ swapkl-result (JSON)" in labels
    html = common.report_html(job, None)
    assert html.lstrip().lower().startswith("<!doctype html") and "4 prompts × 16 tokens" in html


def test_open_saved_result_files_without_the_model(cache, tmp_path, stories_path):
    """A result computed elsewhere (a cluster run's merged --json) is browsed without loading any model."""
    from swapkl.scoring.score import score
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.contract import Contract
    from swapkl.errors import SwapklError

    res = score(load_checkpoint(str(stories_path), device="cpu"), Contract(pairs="gap:2", prompts=3, tokens=12))
    text = res.to_json()
    mgr = _manager()
    job = mgr.open_files(text)
    assert job.status == "done" and job.result.pairs == res.pairs and mgr.loaded_models() == []
    assert mgr.open_files(text.encode()) is job            # the same file is the same job
    with pytest.raises(SwapklError, match="not a JSON file"):
        mgr.open_files(b"{not json")
    with pytest.raises(SwapklError, match="not a swapkl result"):
        mgr.open_files('{"hello": 1}')

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["job_analysis"] = job.key
    at.session_state["job_pinned"] = job.key
    at.run()
    assert not at.exception, at.exception
    s = res.summary()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["mean"] == f"{s['gap']['mean']:.4g}"
    at.switch_page("pages/heatmaps.py").run()
    hm = _charts(at)[0]
    assert hm["data"][0]["z"] == _nan_to_none(res.replacement())
    assert hm["data"][1]["z"] == _nan_to_none(res.interchange())
    assert mgr.loaded_models() == []                        # nothing was loaded to draw it


def test_recommendation_panel_and_export(cache, tmp_path):
    """With "recommended" among the removal methods the start page answers "which layers?": the set and held-out
    ΔPPL of the library's Recommendation, its sentence of evidence, and an export that reloads without them."""
    from swapkl.removal.recommend import Recommendation

    at = _choose_stories(AppTest.from_file(APP, default_timeout=TIMEOUT), pairs="adjacent", budget=1)
    at.multiselect(key="w_methods").set_value(["replacement", "interchange", "recommend"]).run()
    job = _compute(at)
    assert job.status == "done", job.error
    rec = Recommendation.from_curves(job.curves)
    e = rec.entry(1)
    assert any(h.value == "Recommended removal" for h in at.subheader)
    shown = [s.value for s in at.success if s.value.startswith("remove layers")]
    assert shown and shown[0].startswith(f"remove layers {{{', '.join(map(str, e['removed']))}}}: ΔPPL {e['delta_pct']:+.1f} %"), shown
    assert any(rec.explain(1) == m.value for m in at.markdown), [m.value for m in at.markdown][:8]
    out = tmp_path / "rec-export"
    at.text_input(key=[w.key for w in at.text_input if w.key.startswith("w_export_rec_out")][0]).set_value(str(out)).run()
    at.button(key="export_rec").click().run()
    assert not at.exception, at.exception
    meta = json.loads((out / "swapkl_prune.json").read_text())
    assert meta["removed"] == e["removed"]
