"""The evidence job (swapkl.jobs: EvidenceRequest → pipelines.run_evidence → snapshot) and the Evidence page
(AppTest): the headline, the three figures and the contract caption from the job's evidence."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.app_util import APP, STORIES_REL, TIMEOUT, switch_page
from swapkl.contract import Contract
from swapkl.jobs import EvidenceRequest, JobManager, request_key
from swapkl.jobs.policy import Policy, PolicyError

SMALL_EV = {"name": "matched@800w", "max_words": 800, "window": 512, "stride": 256, "drop_first_target": False}


@pytest.fixture(scope="module")
def evidence_job(tmp_path_factory):
    """One real evidence job on stories260K (small contract), run by a job manager with its own cache."""
    import os

    root = tmp_path_factory.mktemp("evjobs")
    old = os.environ.get("SWAPKL_CACHE")
    os.environ["SWAPKL_CACHE"] = str(root / "cache")
    try:
        mgr = JobManager(root=root / "dashboard")
        req = EvidenceRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=32), budget=2,
                              evaluator=SMALL_EV, n_boot=20)
        job = mgr.submit(req)
        assert job.wait(300) and job.status == "done", job.error
        mgr.shutdown()
        yield root, req, job
    finally:
        if old is None:
            os.environ.pop("SWAPKL_CACHE", None)
        else:
            os.environ["SWAPKL_CACHE"] = old


def test_evidence_job_runs_and_is_snapshotted(evidence_job):
    root, req, job = evidence_job
    d = job.evidence.to_dict()
    assert d["layers"] == [0, 1, 2, 3, 4] and d["contract"]["evaluator"]["max_words"] == 800
    assert d["contract"]["bootstrap"] == {"agreement": 100, "stability": 20,
                                          "ground_truth_ci": "1000 window resamples, seed 0"}
    assert job.updates["evidence"] >= 1
    again = JobManager(root=root / "dashboard")
    j2 = again.submit(req)
    assert j2.status == "done" and j2.from_snapshot
    assert json.dumps(j2.evidence.to_dict(), sort_keys=True) == json.dumps(d, sort_keys=True)
    again.shutdown()


def test_demo_mode_bounds_budget_and_bootstrap():
    pol = Policy(demo=True, models=(STORIES_REL,), max_budget=3, max_evidence_boot=100)
    pol.check_request(EvidenceRequest(model=STORIES_REL, budget=3, n_boot=100))
    with pytest.raises(PolicyError, match="at most 3 layers"):
        pol.check_request(EvidenceRequest(model=STORIES_REL, budget=4, n_boot=100))
    with pytest.raises(PolicyError, match="at most 100 bootstrap"):
        pol.check_request(EvidenceRequest(model=STORIES_REL, budget=2, n_boot=500))
    with pytest.raises(PolicyError):
        pol.check_request(EvidenceRequest(model="EleutherAI/pythia-160m", budget=2, n_boot=20))
    assert Policy.from_env({"SWAPKL_DEMO": "1", "SWAPKL_DEMO_MAX_EVIDENCE_BOOT": "50"}).max_evidence_boot == 50


def test_evidence_page_renders_three_figures(cache, evidence_job):
    """Start page analysis → Evidence page (its request served from a snapshot holding the module job's evidence, so
    nothing is computed twice here) → three figures, headline, caption → the start page carries the headline."""
    from streamlit.testing.v1 import AppTest

    from dashboard import common
    from swapkl.jobs import SnapshotStore

    _, _, job = evidence_job
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.radio(key="w_source").set_value("Local folder").run()
    at.selectbox(key="w_local").set_value(STORIES_REL)
    at.number_input(key="w_prompts").set_value(4)
    at.number_input(key="w_tokens").set_value(16)
    at.number_input(key="w_budget").set_value(0)
    at.selectbox(key="w_pairs").set_value("adjacent").run()
    at.button(key="compute").click().run()
    analysis = common.manager().get(at.session_state["job_analysis"])
    assert analysis.wait(180) and analysis.status == "done", analysis.error
    at.run()
    assert not at.exception, at.exception
    assert any("Evidence" in str(p.proto) for p in at.get("page_link"))
    a = analysis.request
    page_req = EvidenceRequest(model=a.model, revision=a.revision, contract=a.contract, budget=2,
                               evaluator=a.evaluator or "matched", n_boot=20)

    class _Done:
        key, request, evidence = request_key(page_req), page_req, job.evidence

    SnapshotStore(cache / "dashboard").save(_Done)
    at.switch_page("pages/evidence.py").run()
    assert not at.exception, at.exception
    assert at.text_input(key="w_ev_model").value == STORIES_REL  # the start page's checkpoint
    at.number_input(key="w_ev_budget").set_value(2)
    at.number_input(key="w_ev_boot").set_value(20).run()
    assert "budget 2" in at.code[0].value and "B=20" in at.code[0].value
    at.button(key="compute_evidence").click().run()
    assert not at.exception, at.exception
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 3
    d = job.evidence.to_dict()
    heat = charts[0]["data"][0]
    names = heat["x"]
    i, j = names.index("bi_prompts"), names.index("ground_truth_ppl")
    assert heat["z"][i][j] == pytest.approx(d["agreement"]["spearman"]["bi_prompts"]["ground_truth_ppl"])
    assert charts[1]["data"][0]["y"] == pytest.approx(d["ground_truth"]["delta_ppl_pct"])
    assert len(charts[2]["data"][0]["y"]) == sum(len(v) for v in d["stability"].values())
    assert all("stories260K" in c["layout"]["meta"]["contract"] for c in charts)
    assert any(d["headline"] in m.value for m in at.markdown)
    assert any(d["set_agreement"]["headline"] in m.value for m in at.markdown)  # the set-level agreement
    labels = [b.label for b in at.get("download_button")]
    assert "CSV" in labels and "⬇ evidence (JSON)" in labels  # the downloads the issue asks for
    # the export button: the set a signal's rule chose on the full sample, written as a folder without those layers
    at.selectbox(key="w_ev_exp_sig").set_value("bi_prompts").run()
    at.selectbox(key="w_ev_exp_n").set_value(2).run()
    at.button(key="ev_export").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    out = Path(at.session_state["_export_ev_export"])
    record = json.loads((out / "swapkl_prune.json").read_text())
    assert record["removed"] == sorted(d["stability"]["bi_prompts"]["2"]["set"])
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 5 - 2
    # back on the start page, the verdict carries the headline
    switch_page(at, "app.py").run()
    assert not at.exception, at.exception
    assert any("How far to trust it" in m.value and d["headline"] in m.value for m in at.markdown)
    # the one-click report holds the session's finished evidence: three more figures
    from swapkl.views.report import figure_count

    assert "⬇ Demo report (HTML)" in [b.label for b in at.get("download_button")]
    ev_job = common.manager().get(at.session_state["job_evidence"])
    assert ev_job.status == "done"
    assert figure_count(common.report_html(analysis, None, ev_job)) == figure_count(common.report_html(analysis)) + 3


def test_demo_mode_evidence_page_offers_the_allow_list_only(cache, monkeypatch):
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", f"default,{STORIES_REL}")
    monkeypatch.setenv("SWAPKL_DEMO_MAX_EVIDENCE_BOOT", "100")
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/evidence.py").run()
    assert not at.exception, at.exception
    assert not [t for t in at.text_input if t.key == "w_ev_model"]  # no typed checkpoint
    assert at.selectbox(key="w_ev_model").options == ["default", STORIES_REL]
    assert at.number_input(key="w_ev_boot").max == 100 and at.number_input(key="w_ev_budget").max == 6
    from dashboard import common

    assert common.manager().jobs() == []
