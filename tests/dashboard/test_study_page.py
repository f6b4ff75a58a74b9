"""The study job (swapkl.jobs.studies: StudyRequest → run_study_job → snapshot) and the Study page (AppTest): the
progress per model, the grid with a link from each row to that model's own analysis, the I/R small multiples and
the ρ dot plot -- the figure JSON the library makes from the same study -- and a study opened by link shows the same
grid."""
from __future__ import annotations

import json
from urllib.parse import parse_qs, urlparse

import pytest

from support.app_util import APP, STORIES_REL, TIMEOUT
from swapkl.contract import Contract
from swapkl.errors import SwapklError
from swapkl.jobs import JobManager
from swapkl.jobs import studies as S
from swapkl.jobs.policy import Policy, PolicyError

WIKI = "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"
CONTRACT = Contract(prompts=4, tokens=32, corpus=WIKI, device="cpu")


def request(text=STORIES_REL, **kw):
    return S.study_request(text, kw.pop("contract", CONTRACT), kw.pop("budget", 2), kw.pop("max_words", 600),
                           kw.pop("n_boot", 50), evidence=kw.pop("evidence", False), eval_text=kw.pop("eval_text", WIKI))


def test_the_form_builds_one_checked_request_and_its_link_round_trips():
    req = request(f"{STORIES_REL} Stories\n# a comment\n\n{STORIES_REL}@main other")
    assert [m.label for m in req.plan.models] == ["Stories", "other"]
    assert req.plan.evaluator == {"name": "matched@600w", "max_words": 600, "window": 512, "stride": 256,
                                  "drop_first_target": False}
    form = S.query_form(S.study_query(req))
    assert form["models"].splitlines() == [f"{STORIES_REL} Stories", f"{STORIES_REL}@main other"]
    assert (form["budget"], form["max_words"], form["n_boot"], form["evidence"]) == (2, 600, 50, False)
    with pytest.raises(SwapklError, match="at least one model"):
        request("# nothing\n")
    with pytest.raises(SwapklError, match="share the label"):
        request(f"{STORIES_REL} a\n{STORIES_REL} a")
    link = urlparse(S.analysis_link(req, req.plan.models[0].to_dict()))
    q = {k: v[0] for k, v in parse_qs(link.query).items()}
    assert link.path == "/" and q["model"] == STORIES_REL and q["prompts"] == "4" and q["budget"] == "2"


def test_demo_mode_offers_only_its_models():
    pol = Policy(demo=True, models=(STORIES_REL,), max_budget=3, max_evidence_boot=100)
    plain = {"contract": Contract(prompts=4, tokens=32), "eval_text": None}
    pol.check_request(request(**plain))
    with pytest.raises(PolicyError):
        pol.check_request(request("EleutherAI/pythia-160m", **plain))
    with pytest.raises(PolicyError, match="at most 3 layers"):
        pol.check_request(request(budget=4, **plain))
    with pytest.raises(PolicyError, match="held-out text"):
        pol.check_request(request(contract=plain["contract"]))


@pytest.fixture(scope="module")
def study_job(tmp_path_factory):
    """One real study job (stories260K, the page's contract at 4 x 32) run by a job manager with its own cache."""
    from swapkl.jobs.defaults import default_contract

    root = tmp_path_factory.mktemp("studyjobs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWAPKL_CACHE", str(root / "cache"))
        page = Contract(**(default_contract().to_dict() | {"prompts": 4, "tokens": 32}))  # what the page builds
        req = request(evidence=True, contract=page, eval_text=None)
        mgr = JobManager(root=root / "dashboard")
        job = mgr.submit(req)
        finished = job.wait(300)
        mgr.shutdown()
        assert finished and job.status == "done", job.error
        yield root, req, job


def test_the_study_job_runs_publishes_and_is_snapshotted(study_job):
    root, req, job = study_job
    d = job.study.to_dict()
    assert [r["status"] for r in d["rows"]] == ["done"] and d["rows"][0]["layers"] == 5
    assert job.updates["study"] >= 1 and d["contract"] == req.plan.contract_dict()
    again = JobManager(root=root / "dashboard")
    j2 = again.submit(req)
    assert j2.status == "done" and j2.from_snapshot
    assert json.dumps(j2.study.to_dict(), sort_keys=True) == json.dumps(d, sort_keys=True)
    again.shutdown()


def test_the_study_page_draws_the_grid_and_the_library_figures(cache, study_job):
    from streamlit.testing.v1 import AppTest

    from swapkl.jobs import SnapshotStore, request_key
    from swapkl.study.figures import figures

    _, req, job = study_job

    class _Done:
        key, request, study = request_key(req), req, job.study

    SnapshotStore(cache / "dashboard").save(_Done)  # the page's request is answered by the module's study
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for k, v in S.study_query(req).items():  # a study opened by link
        at.query_params[k] = v
    at.run()
    at.switch_page("pages/study.py").run()
    assert not at.exception, at.exception
    assert at.text_area(key="w_st_models").value == STORIES_REL and at.number_input(key="w_st_budget").value == 2
    at.checkbox(key="w_st_evidence").check().run()
    at.number_input(key="w_st_prompts").set_value(4)
    at.number_input(key="w_st_tokens").set_value(32).run()
    assert not at.exception, at.exception
    frames = [f.value for f in at.dataframe]
    assert len(frames) == 2, ([c.value for c in at.code], [e.value for e in at.error], [i.value for i in at.info])
    progress, grid = frames[0], frames[1]
    assert list(progress["status"]) == ["done"]
    row = job.study.rows[0]
    assert grid["model"][0] == row["model"]["label"] and grid["layers"][0] == 5
    assert grid["analysis"][0] == S.analysis_link(req, row["model"])
    assert grid["n=1 ΔPPL% R"][0] == pytest.approx(round(row["removal"]["rows"][0]["replacement"]["delta_pct"], 2))
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    lib = {k: json.loads(f.to_json()) for k, f in figures(job.study).items()}
    assert len(charts) == len(lib) == 2
    assert charts[0]["data"][0]["y"] == pytest.approx(lib["ratio"]["data"][0]["y"])
    assert charts[1]["data"][0]["x"] == pytest.approx(lib["rho"]["data"][0]["x"])
    assert all("bootstrap B=50" in c["layout"]["meta"]["contract"] for c in charts)
