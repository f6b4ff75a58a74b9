"""An evidence job with a repair started from the dashboard: ``EvidenceRequest.repair`` / ``bridge`` (a request
without a repair keeps its old dict and job key), the form's one-line refusals and the demo cap, the pipeline's
``compute_evidence(repair=BridgeSettings(...))`` on stories260K, and the Evidence page (AppTest): the "After
repair" choice reaches the request and the job, the finished job shows the after-repair statement and table."""
from __future__ import annotations

import pytest

from support.app_util import APP, STORIES_REL, TIMEOUT
from swapkl import __version__
from swapkl.contract import Contract, stable_hash
from swapkl.errors import SwapklError
from swapkl.jobs import EvidenceRequest, JobManager, request_key
from swapkl.jobs.forms import evidence_request
from swapkl.jobs.policy import DEMO_MAX_BRIDGE_TOKENS, Policy, PolicyError
from swapkl.jobs.requests import quick_fingerprint

SMALL_EV = {"name": "matched@800w", "max_words": 800, "window": 512, "stride": 256, "drop_first_target": False}
BRIDGE = {"form": "residual", "calib_tokens": 512}


def test_a_request_without_repair_keeps_its_dict_and_job_key():
    req = EvidenceRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=32), budget=2, evaluator=SMALL_EV,
                          n_boot=20)
    old = {"kind": "evidence", "model": STORIES_REL, "revision": None, "contract": Contract(prompts=4, tokens=32)
           .to_dict(), "budget": 2, "evaluator": SMALL_EV, "n_boot": 20}  # the dict before the repair existed
    assert req.to_dict() == old
    fp = quick_fingerprint(STORIES_REL)
    assert request_key(req) == stable_hash({"request": {**old, "fingerprint": fp}, "version": __version__})[:20]
    # "none" with settings given is the same request; a repair is another job
    same = EvidenceRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=32), budget=2, evaluator=SMALL_EV,
                           n_boot=20, repair="none", bridge=BRIDGE)
    assert request_key(same) == request_key(req) and same.bridge == {} and same.bridge_settings() is None
    rep = EvidenceRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=32), budget=2, evaluator=SMALL_EV,
                          n_boot=20, repair="bridge", bridge=BRIDGE)
    assert rep.to_dict() == {**old, "repair": "bridge", "bridge": BRIDGE}
    assert request_key(rep) != request_key(req)
    assert "after a linear bridge (residual, 512 calibration tokens)" in rep.label()


def test_the_form_refuses_bad_repair_settings_in_one_line():
    ok = evidence_request(STORIES_REL, 2, 20, None, "bridge", {"form": "folded", "calib_tokens": 4096})
    assert (ok.repair, ok.bridge) == ("bridge", {"form": "folded", "calib_tokens": 4096})
    assert evidence_request(STORIES_REL, 2, 20, None, "none", BRIDGE).bridge == {}
    for repair, bridge, words in (("bridge", {"calib_tokens": 10 ** 9}, "calibration tokens must be an integer"),
                                  ("bridge", {"calib_tokens": 255}, "calibration tokens must be an integer"),
                                  ("bridge", {"calib_tokens": True}, "calibration tokens must be an integer"),
                                  ("bridge", {"calib_tokens": "512"}, "calibration tokens must be an integer"),
                                  ("bridge", {"form": "cubic"}, "unknown bridge form 'cubic'"),
                                  ("lora", {}, "unknown repair 'lora'")):
        with pytest.raises(SwapklError, match=words) as e:
            evidence_request(STORIES_REL, 2, 20, None, repair, bridge)
        assert "\n" not in str(e.value)
    pol = Policy(demo=True, models=(STORIES_REL,), max_budget=3, max_evidence_boot=100)
    pol.check_request(evidence_request(STORIES_REL, 2, 20, None, "bridge", {"calib_tokens": DEMO_MAX_BRIDGE_TOKENS}))
    with pytest.raises(PolicyError, match=f"at most {DEMO_MAX_BRIDGE_TOKENS} calibration tokens") as e:
        pol.check_request(evidence_request(STORIES_REL, 2, 20, None, "bridge",
                                           {"calib_tokens": DEMO_MAX_BRIDGE_TOKENS + 1}))
    assert "\n" not in str(e.value)


def test_bridge_settings_the_bridge_refuses_fail_the_job_in_one_line(cache_dir):
    """A request built by hand (not through the form) with settings the bridge refuses: the job fails with one
    line, before the model is loaded."""
    mgr = JobManager(root=cache_dir / "dashboard")
    try:
        for bridge, words in (({"calib_tokens": 3}, "must be at least the calibration window"),
                              ({"bogus": 1}, "unknown bridge setting")):
            job = mgr.submit(EvidenceRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=32), budget=1,
                                             evaluator=SMALL_EV, n_boot=10, repair="bridge", bridge=bridge))
            assert job.wait(120) and job.status == "error"
            assert words in job.error and "\n" not in job.error.strip() and "Traceback" not in job.error
    finally:
        mgr.shutdown()


@pytest.fixture(scope="module")
def repair_job(tmp_path_factory):
    """One real evidence job with a bridge on stories260K (small contract and evaluator)."""
    import os

    root = tmp_path_factory.mktemp("evrepair")
    old = os.environ.get("SWAPKL_CACHE")
    os.environ["SWAPKL_CACHE"] = str(root / "cache")
    try:
        mgr = JobManager(root=root / "dashboard")
        req = EvidenceRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=16), budget=1,
                              evaluator=SMALL_EV, n_boot=10, repair="bridge", bridge=BRIDGE)
        job = mgr.submit(req)
        assert job.wait(300) and job.status == "done", job.error
        mgr.shutdown()
        yield req, job
    finally:
        if old is None:
            os.environ.pop("SWAPKL_CACHE", None)
        else:
            os.environ["SWAPKL_CACHE"] = old


def test_the_pipeline_computes_the_after_repair_part_with_the_requested_bridge(repair_job):
    from swapkl.evidence.repair import check_part

    req, job = repair_job
    rep = job.evidence.to_dict()["repair"]
    check_part(rep)  # the part after_repair writes: statement, rule, both agreement tables, bridge contract
    # the request's settings reached compute_evidence: the bridge contract is BridgeSettings(**req.bridge)'s
    from swapkl.repair.bridged_kl import BridgeSettings

    assert rep["contract"]["bridge"] == BridgeSettings(**BRIDGE).to_dict()
    assert rep["contract"]["calibration"]["tokens"] == 512
    assert rep["statement"].startswith("after a bridge")
    assert set(rep["agreement"]["bridged"]) == set(rep["agreement"]["raw"])


def test_the_evidence_page_starts_a_repair_job_and_shows_the_after_repair_part(cache, repair_job):
    """Evidence page → "After repair": linear bridge, residual, 512 tokens → the request's label and the started
    job's request carry it → the finished job (served from a snapshot holding the module job's evidence) shows the
    statement, the rule and the after-repair table, row for row."""
    from streamlit.testing.v1 import AppTest

    from dashboard import common
    from swapkl.evidence import repair as R
    from swapkl.jobs import SnapshotStore

    _, done = repair_job
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/evidence.py").run()
    assert not at.exception, at.exception
    at.text_input(key="w_ev_model").set_value(STORIES_REL)
    at.number_input(key="w_ev_budget").set_value(1)
    at.number_input(key="w_ev_boot").set_value(10)
    at.radio(key="w_ev_repair").set_value("bridge").run()
    assert not at.exception, at.exception
    at.selectbox(key="w_ev_bridge_form").set_value("residual")
    at.number_input(key="w_ev_bridge_tokens").set_value(512).run()
    assert not at.error, [e.value for e in at.error]
    assert "after a linear bridge (residual, 512 calibration tokens)" in at.code[0].value
    page_req = evidence_request(STORIES_REL, 1, 10, None, "bridge", BRIDGE)

    class _Done:
        key, request, evidence = request_key(page_req), page_req, done.evidence

    SnapshotStore(cache / "dashboard").save(_Done)
    at.button(key="compute_evidence").click().run()
    assert not at.exception, at.exception
    job = common.manager().get(at.session_state["job_evidence"])
    assert job.status == "done" and (job.request.repair, job.request.bridge) == ("bridge", BRIDGE)
    assert [h.value for h in at.subheader if h.value == "After repair"] == ["After repair"]
    rep = done.evidence.to_dict()["repair"]
    assert any(rep["statement"] in m.value for m in at.markdown)
    assert any(rep["rule"] in c.value for c in at.caption)
    (table,) = [t for t in at.dataframe if "ρ vs bridged ground truth" in t.value.columns]
    want = R.rows(rep)
    assert list(table.value["signal"]) == [r["signal"] for r in want]
    assert list(table.value["ρ vs bridged ground truth"]) == [r["ρ vs bridged ground truth"] for r in want]


def test_a_snapshot_without_the_repair_part_does_not_answer_a_repair_request(tmp_path, repair_job):
    from swapkl.evidence.run import EvidenceResult
    from swapkl.jobs import Job, SnapshotStore

    req, done = repair_job
    raw = {k: v for k, v in done.evidence.to_dict().items() if k != "repair"}
    store = SnapshotStore(tmp_path)

    class _Raw:
        key, request, evidence = "k-raw", req, EvidenceResult(raw)

    class _Full:
        key, request, evidence = "k-full", req, done.evidence

    store.save(_Raw)
    store.save(_Full)
    assert not store.load(Job("k-raw", req))
    full = Job("k-full", req)
    assert store.load(full) and full.evidence.to_dict()["repair"] == done.evidence.to_dict()["repair"]
