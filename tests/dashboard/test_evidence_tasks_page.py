"""An evidence job with the task ground truth started from the dashboard: ``EvidenceRequest.tasks`` (a request
without tasks keeps its old dict and job key), the demo server's task bounds, the pipeline's
``compute_evidence(tasks=TaskSettings(...))`` on stories260K, and the Evidence page (AppTest): the task choice
reaches the request."""
from __future__ import annotations

import pytest

from support.app_util import APP, STORIES_REL, TIMEOUT
from swapkl.contract import Contract
from swapkl.jobs import EvidenceRequest, JobManager, request_key
from swapkl.jobs.forms import evidence_request
from swapkl.jobs.policy import Policy, PolicyError

SMALL_EV = {"name": "matched@800w", "max_words": 800, "window": 512, "stride": 256, "drop_first_target": False}
TASK, INCLUDE = "tinystories_mc", "tests/fixtures/tasks"


def test_a_request_without_tasks_keeps_its_dict_and_job_key():
    kw = dict(model=STORIES_REL, contract=Contract(prompts=4, tokens=32), budget=2, evaluator=SMALL_EV, n_boot=20)
    plain = EvidenceRequest(**kw)
    assert "tasks" not in plain.to_dict() and plain.task_settings() is None
    with_tasks = EvidenceRequest(**kw, tasks=(TASK,), limit=8, include_path=INCLUDE)
    assert with_tasks.to_dict() == {**plain.to_dict(), "tasks": [TASK], "limit": 8, "num_fewshot": None,
                                    "include_path": INCLUDE}
    assert request_key(with_tasks) != request_key(plain)
    s = with_tasks.task_settings()
    assert (s.tasks, s.limit, s.include_path) == ((TASK,), 8, INCLUDE)
    assert "task ground truth tinystories_mc (first 8 documents)" in with_tasks.label()
    # the form drops the task settings without tasks
    assert evidence_request(STORIES_REL, 2, 20, None, tasks=(), limit=8, include=INCLUDE).to_dict() == \
        evidence_request(STORIES_REL, 2, 20, None).to_dict()


def test_a_demo_server_bounds_the_task_ground_truth_as_task_accuracy():
    pol = Policy(demo=True, models=(STORIES_REL,), max_budget=3, max_evidence_boot=100, tasks=(TASK,),
                 task_include_path=INCLUDE, max_task_limit=50)
    pol.check_request(evidence_request(STORIES_REL, 2, 20, None, tasks=(TASK,), limit=50, include=INCLUDE))
    for kw, words in ((dict(tasks=("hellaswag",), limit=10, include=INCLUDE), "runs only these tasks"),
                      (dict(tasks=(TASK,), limit=51, include=INCLUDE), "at most 50 documents"),
                      (dict(tasks=(TASK,), limit=None, include=INCLUDE), "at most 50 documents"),
                      (dict(tasks=(TASK,), limit=10, include="/etc"), "never takes a task folder")):
        with pytest.raises(PolicyError, match=words) as e:
            pol.check_request(evidence_request(STORIES_REL, 2, 20, None, **kw))
        assert "\n" not in str(e.value)


def test_the_pipeline_computes_the_task_ground_truth(cache_dir, monkeypatch):
    """... and loads its task once, on the job's thread (the disjointness check and the measurement share it)."""
    from swapkl.measure import lmeval

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    loads, real = [], lmeval.load_task
    monkeypatch.setattr(lmeval, "load_task", lambda tm, name: loads.append(name) or real(tm, name))
    mgr = JobManager(root=cache_dir / "dashboard")
    try:
        req = EvidenceRequest(model=STORIES_REL, contract=Contract(prompts=4, tokens=16), budget=1,
                              evaluator=SMALL_EV, n_boot=10, tasks=(TASK,), limit=8, include_path=INCLUDE)
        job = mgr.submit(req)
        assert job.wait(300) and job.status == "done", job.error
    finally:
        mgr.shutdown()
    d = job.evidence.to_dict()
    t = d["task_truth"]
    assert t["tasks"] == [TASK] and t["n_docs"] == {TASK: 8} and len(t["acc_loss"]) == len(d["layers"])
    assert d["contract"]["tasks"]["limit"] == 8 and d["contract"]["tasks"]["disjoint"]
    assert "ground_truth_acc" in d["agreement"]["spearman"]
    assert loads == [TASK] and not lmeval._HELD.tasks


def test_the_evidence_page_puts_the_chosen_task_in_the_request():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/evidence.py").run()
    assert not at.exception, at.exception
    at.text_input(key="w_ev_model").set_value(STORIES_REL)
    at.number_input(key="w_ev_budget").set_value(1)
    at.checkbox(key="w_ev_with_tasks").check().run()
    assert not at.exception, at.exception
    at.text_input(key="w_ev_tasks").set_value(TASK)
    at.number_input(key="w_ev_tasks_limit").set_value(8).run()
    assert not at.error, [e.value for e in at.error]
    assert "task ground truth tinystories_mc (first 8 documents)" in at.code[0].value
