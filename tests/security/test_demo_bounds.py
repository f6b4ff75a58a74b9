"""Issue 51: the revisions an allow-list entry allows (pull-request refs only when listed), and the bounds of one
visitor's jobs on a demo server (models per study, checkpoints per trajectory, held-out words, the wall-time limit
with the finished parts kept, computations per client address over all its sessions)."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from support.app_util import APP, STORIES_REL, TIMEOUT

from swapkl.contract import Contract
from swapkl.errors import PolicyError
from swapkl.jobs.policy import Policy
from swapkl.measure.evaluate import Evaluator

QUICK_EV = Evaluator("quick-test", max_words=400, window=64, stride=32)
POL = Policy(demo=True, models=("default", "EleutherAI/pythia-160m", "EleutherAI/pythia-410m@step*",
                                "Qwen/Qwen3-0.6B@main|refs/pr/7", STORIES_REL))


@pytest.mark.parametrize("spec, rev, ok", [
    ("EleutherAI/pythia-160m", None, True), ("EleutherAI/pythia-160m", "main", True),   # default branch only
    ("EleutherAI/pythia-160m", "step1000", False), ("EleutherAI/pythia-160m@step1000", None, False),
    ("EleutherAI/pythia-160m", "refs/pr/1", False),
    ("EleutherAI/pythia-410m", "step143000", True), ("EleutherAI/pythia-410m@step0", None, True),     # a pattern
    ("EleutherAI/pythia-410m", "refs/pr/1", False), ("EleutherAI/pythia-410m", "stepx/../..", False),
    ("EleutherAI/pythia-410m", None, False), ("EleutherAI/pythia-410m", "main", False),
    ("Qwen/Qwen3-0.6B", "main", True), ("Qwen/Qwen3-0.6B", "refs/pr/7", True),                          # a list
    ("Qwen/Qwen3-0.6B", "refs/pr/8", False), ("Qwen/Qwen3-0.6B@main|refs/pr/7", None, False),
    (STORIES_REL, None, True), (STORIES_REL, "main", False), ("default", None, True), ("default", "x", False)])
def test_an_entry_names_the_revisions_it_allows(spec, rev, ok):
    if ok:
        POL.check_model(spec, rev)
    else:
        with pytest.raises(PolicyError) as e:
            POL.check_model(spec, rev)
        assert "\n" not in str(e.value) and "tests/fixtures" not in str(e.value)  # no server path in a refusal


def test_allow_list_tables_in_the_config_file(tmp_path):
    f = tmp_path / "swapkl.toml"
    f.write_text('[demo]\nenabled = true\nmodels = ["default", {id = "EleutherAI/pythia-70m", revisions = '
                 '["step0", "step1000"]}, {id = "EleutherAI/pythia-160m", revisions = "step*"}]\n'
                 'max_study_models = 2\nmax_job_s = 60\n')
    p = Policy.from_env({}, f)
    assert p.models == ("default", "EleutherAI/pythia-70m@step0|step1000", "EleutherAI/pythia-160m@step*")
    assert p.max_study_models == 2 and p.job_seconds == 60.0
    p.check_model("EleutherAI/pythia-70m", "step1000")
    p.check_model("EleutherAI/pythia-160m", "step5")
    with pytest.raises(PolicyError):
        p.check_model("EleutherAI/pythia-70m", "step2000")
    f.write_text('[demo]\nmodels = [{id = "../etc", revisions = "*"}]\n')
    with pytest.raises(PolicyError, match="allow-list"):
        Policy.from_env({}, f)


def test_a_pattern_entry_takes_a_typed_revision_and_refuses_a_pull_request_ref(cache, monkeypatch):
    """Through the Start page: the entry's revision box, a pull-request ref refused in one line before anything is
    fetched or queued."""
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", "default,EleutherAI/pythia-160m@step*")
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="w_demo_model").set_value("EleutherAI/pythia-160m@step*").run()
    at.text_input(key="w_demo_rev").set_value("refs/pr/1").run()
    assert not at.exception
    at.button(key="compute").click().run()
    assert any("does not offer that revision of EleutherAI/pythia-160m" in e.value for e in at.error), \
        [e.value for e in at.error]
    from dashboard import common

    assert common.manager().jobs() == [] and common.manager().models.loads == 0


def test_a_study_link_of_sixty_models_is_refused_with_the_button_off(cache, monkeypatch):
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", f"default,{STORIES_REL}")
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["models"] = ";".join(["default"] * 60)
    at.run()
    at.switch_page("pages/study.py").run()
    assert not at.exception
    lines = [f"default d{k}" for k in range(60)]
    at.text_area(key="w_st_models").set_value("\n".join(lines)).run()
    assert any("at most 3 models" in e.value and "60 given" in e.value for e in at.error), [e.value for e in at.error]
    assert at.button(key="run_study").disabled


def test_a_trajectory_of_145_checkpoints_is_refused_with_the_button_off(cache, monkeypatch):
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", "default,EleutherAI/pythia-160m@step*")
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/trajectory.py").run()
    at.text_area(key="w_tr_list").set_value("EleutherAI/pythia-160m@step0" + "".join(f" @step{k * 1000}"
                                                                                  for k in range(1, 145)))
    at.run()
    assert not at.exception
    assert any("at most 8 checkpoints per trajectory; 145 given" in e.value for e in at.error), \
        [e.value for e in at.error]
    assert at.button(key="compute_traj").disabled
    at.text_area(key="w_tr_list").set_value("EleutherAI/pythia-160m@step0 @step1000 @refs/pr/1").run()
    assert any("does not offer that revision" in e.value for e in at.error) and at.button(key="compute_traj").disabled
    from dashboard import common

    assert common.manager().jobs() == []


def test_study_and_trajectory_bounds():
    from swapkl.jobs import TrajectoryRequest
    from swapkl.jobs.studies import study_request

    c = Contract(prompts=4, tokens=16)
    POL.check_request(study_request("default\n" + STORIES_REL, c, 1, 20_000, 100))
    with pytest.raises(PolicyError, match="at most 20000 held-out words per model; 20001 asked"):
        POL.check_request(study_request("default", c, 1, 20_001, 100))
    with pytest.raises(PolicyError, match="at most 4096 prompt tokens"):
        POL.check_request(study_request("default", Contract(prompts=64, tokens=128), 1, 400, 100))
    steps = ", ".join(f"@step{k * 1000}" for k in range(145))
    with pytest.raises(PolicyError, match="at most 8 checkpoints per trajectory; 145 given"):
        POL.check_request(TrajectoryRequest(f"EleutherAI/pythia-410m{steps}", c))
    POL.check_request(TrajectoryRequest("EleutherAI/pythia-410m@step0 @step1000 @step143000", c))
    with pytest.raises(PolicyError, match="this server's own folder"):
        POL.check_request(TrajectoryRequest("/etc", c, train_demo=True))


def test_the_queue_is_bounded_per_client_address_over_its_sessions(tmp_path, monkeypatch):
    """One client opening many sessions: its fifth computation is refused, another address is still served, and
    joining an identical job is never refused."""
    from swapkl.jobs import AnalysisRequest, JobManager

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    pol = Policy(demo=True, models=(STORIES_REL,), max_jobs_per_session=2, max_jobs_per_client=4, max_queued=8)
    mgr = JobManager(root=tmp_path / "d", policy=pol)
    mgr._ensure_worker = lambda: None  # nothing runs: the jobs stay queued, as behind a long computation
    reqs = [AnalysisRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=16, seed=k), budget=0)
            for k in range(6)]
    for k in range(4):
        mgr.submit(reqs[k], owner=f"session-{k}", client="10.0.0.5")
    with pytest.raises(PolicyError, match="your address already has 4 computations queued or running"):
        mgr.submit(reqs[4], owner="session-new", client="10.0.0.5")
    assert mgr.submit(reqs[0], owner="session-new", client="10.0.0.5") is mgr.find(reqs[0])  # joining is free
    mgr.submit(reqs[4], owner="session-9", client="10.0.0.6")
    assert sum(j.client == "10.0.0.5" for j in mgr.active()) == 4 and len(mgr.active()) == 5
    mgr.shutdown(0.1)


def test_a_job_past_its_time_limit_stops_with_its_reason_and_keeps_what_finished(tmp_path, monkeypatch):
    """The wall-time limit (demo mode): the job ends with the reason in one line, and the chunks of pairs it
    finished are in the cache, so the same request afterwards reads them back and computes only the rest."""
    import time

    from swapkl.jobs import CANCELLED, DONE, AnalysisRequest, JobManager

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    pol = Policy(demo=True, models=(STORIES_REL,), max_job_s=60, max_prompt_tokens=100_000)
    mgr = JobManager(root=tmp_path / "d", policy=pol, use_snapshots=False)
    mgr._ensure_worker = lambda: None  # run it here, in this thread
    req = AnalysisRequest(model=STORIES_REL, contract=Contract(pairs="gap:3", prompts=16, tokens=32, device="cpu"),
                          budget=0)
    job = mgr.submit(req, owner="s", client="c")
    assert job.time_limit == 60.0
    ticks, tick = [], job.tick

    def late_tick(done, total, what):  # after the first finished chunk the clock says the limit has passed
        tick(done, total, what)
        ticks.append(done)
        if done > 0 and job.started > time.time() - 61:
            job.started -= 61

    job.tick = late_tick
    mgr._run(job)
    assert job.status == CANCELLED and "time limit" in job.error and "\n" not in job.error, job.summary()
    stopped_at = max(ticks)
    entries = [f for f in (tmp_path / "cache" / "scores").rglob("chunk-*.json")]
    assert 0 < stopped_at < job.progress().total and entries, (ticks, job.progress())
    mgr.shutdown()
    local = JobManager(root=tmp_path / "d2", use_snapshots=False)  # a local server: no limit; resumes from the cache
    again = local.submit(req)
    assert again.time_limit is None and again.wait(300) and again.status == DONE
    local.shutdown()
