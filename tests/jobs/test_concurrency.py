"""Several visitors at once, below the browser: the heavy imports happen once behind one lock, a transient
failure is retried once, identical requests share one model copy, queued jobs know their place, the server-wide
queue is bounded, and a job nobody waits for any more is cancelled while a job others wait for goes on."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from swapkl.contract import Contract
from swapkl.measure.evaluate import Evaluator

ROOT = Path(__file__).resolve().parents[2]
QUICK_EV = Evaluator("quick-test", max_words=400, window=64, stride=32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _request(stories_path, prompts=4, budget=0):
    from swapkl.jobs import AnalysisRequest

    return AnalysisRequest(model=str(stories_path), contract=Contract(pairs="adjacent", prompts=prompts, tokens=16,
                                                                     device="cpu"),
                           budget=budget, methods=("replacement", "interchange"), evaluator=QUICK_EV)


# ----------------------------------------------------------------------------------------------- imports
RACE = textwrap.dedent("""
    import sys, threading
    from swapkl import heavy
    errors = []
    def job():       # the job worker: waits for the imports, then resolves what loading a model needs
        try:
            heavy.ensure()
            from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
        except Exception as e:
            errors.append(repr(e))
    def warm():      # the dashboard's warm-up thread
        try:
            heavy.start_background().join()
            from transformers import LlamaForCausalLM  # noqa: F401
        except Exception as e:
            errors.append(repr(e))
    def page():      # a browser session's script run: torch for the device default
        try:
            import torch
            torch.cuda.is_available()
        except Exception as e:
            errors.append(repr(e))
    ts = [threading.Thread(target=f) for f in (warm, job, job, page, page, page)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    print(errors)
    sys.exit(1 if errors or not heavy.ready() else 0)
""")


def test_first_imports_from_many_threads_do_not_race():
    """Fresh interpreters, six threads importing at once the way a fresh server's job, warm-up and page threads
    do (without the lock this failed about one start in eight with "cannot import name 'AutoModelForCausalLM'
    from 'transformers'")."""
    for _ in range(4):
        r = subprocess.run([sys.executable, "-c", RACE], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr[-2000:]


def test_a_transient_failure_is_retried_once(cache, stories_path):
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.jobs import DONE, ERROR, JobManager

    calls = []

    def flaky(*a, **k):  # the first load fails the way the import race did, the second works
        calls.append(1)
        if len(calls) == 1:
            raise ImportError("cannot import name 'AutoModelForCausalLM' from 'transformers'")
        return load_checkpoint(*a, **k)

    mgr = JobManager(loader=flaky, use_snapshots=False)
    try:
        job = mgr.submit(_request(stories_path))
        assert job.wait(120) and job.status == DONE, job.error
        assert len(calls) == 2 and any("retrying after ImportError" in ln for ln in job.log)
        log = (cache / "logs" / "dashboard.log").read_text()
        assert "retrying once" in log and log.count(" started: ") == 1
        # a failure that stays: one line that says what to do
        from swapkl.jobs import ModelCache

        mgr.models = ModelCache(2, lambda *a, **k: (_ for _ in ()).throw(ImportError("cannot import name 'X'")))
        bad = mgr.submit(_request(stories_path, prompts=5))
        assert bad.wait(60) and bad.status == ERROR and bad.error_kind == "bug"
        assert "press Compute to try again" in bad.error and "restart the server" in bad.error
    finally:
        mgr.shutdown()


def test_one_model_copy_for_concurrent_loads():
    from swapkl.jobs import ModelCache

    loads = []

    def slow(model, revision=None, dtype="float32", device="auto"):
        loads.append(model)
        time.sleep(0.3)
        return object()

    mc = ModelCache(2, slow)
    got = []
    ts = [threading.Thread(target=lambda: got.append(mc.get("m", None, "float32", "cpu"))) for _ in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert loads == ["m"] and len({id(g) for g in got}) == 1
    mc.get("other", None)
    assert loads == ["m", "other"] and len(mc.keys()) == 2


# ----------------------------------------------------------------------------------------------- queue
def _slow_loader(gate: threading.Event, started: threading.Event | None = None):
    """A loader that says when it is called (``started``: the first job is running) and then waits for ``gate``."""
    from swapkl.model.checkpoints import load_checkpoint

    def load(*a, **k):
        if started is not None:
            started.set()
        gate.wait(60)
        return load_checkpoint(*a, **k)

    return load


def test_queued_jobs_know_their_place_and_the_queue_is_bounded(cache, stories_path):
    from swapkl.jobs import DONE, JobManager
    from swapkl.jobs.policy import PolicyError

    gate, started = threading.Event(), threading.Event()
    mgr = JobManager(loader=_slow_loader(gate, started), use_snapshots=False)
    try:
        a = mgr.submit(_request(stories_path, prompts=4), owner="s1", max_active=2, max_total=3)
        assert started.wait(120) and a.status == "running"  # the worker is inside a's model load
        b = mgr.submit(_request(stories_path, prompts=5), owner="s2", max_active=2, max_total=3)
        c = mgr.submit(_request(stories_path, prompts=6), owner="s3", max_active=2, max_total=3)
        assert (b.queue_place, c.queue_place) == (1, 2)
        assert b.progress_line().startswith("queued: 1 computation ahead of this one")
        assert c.progress_line().startswith("queued: 2 computations ahead of this one")
        # the fourth distinct computation is refused with a message that says what to do; joining is free
        with pytest.raises(PolicyError, match="server is busy: 3 computations are queued or running"):
            mgr.submit(_request(stories_path, prompts=7), owner="s4", max_active=2, max_total=3)
        assert mgr.submit(_request(stories_path, prompts=6), owner="s4", max_active=2, max_total=3) is c
        # the running one ends: everybody moves up, and the queued job publishes its new place (what its page
        # shows) while it still waits -- recorded at each publication, no polling
        seen = []
        c.publish = lambda force=False, min_interval_s=0.5: seen.append((c.status, c.queue_place))
        gate.set()
        assert a.wait(120) and a.status == DONE
        assert b.wait(120) and c.wait(120) and b.status == c.status == DONE
        assert seen[0] == ("queued", 1), seen
    finally:
        gate.set()
        mgr.shutdown()


# ----------------------------------------------------------------------------------------------- audience
def test_audience_rule():
    from swapkl.jobs.audience import Audience

    alive = {"a": True, "b": True}
    au = Audience(lambda s: alive[s], grace_s=0.2)
    assert not au.abandoned("job")                 # nobody ever watched (the CLI, the library): never
    au.watch("job", "a")
    au.watch("job", "b")
    alive["a"] = False
    assert not au.abandoned("job") and au.watchers("job") == ["b"]   # one left, the other still waits
    alive["b"] = False
    assert not au.abandoned("job")                 # everybody gone, but a refresh gets a grace period
    time.sleep(0.25)
    assert au.abandoned("job")
    au.watch("job", "c")                           # a refresh came back as a new session
    alive["c"] = True
    assert not au.abandoned("job")
    assert not Audience(None).abandoned("job")


def test_a_job_nobody_waits_for_is_cancelled_and_one_others_wait_for_goes_on(cache, stories_path):
    from swapkl.jobs import CANCELLED, DONE, JobManager

    gate = threading.Event()
    alive = {"left": True, "stays": True, "alone": True}
    mgr = JobManager(loader=_slow_loader(gate), use_snapshots=False, alive=lambda s: alive[s], grace_s=0.3)
    try:
        shared = mgr.submit(_request(stories_path, prompts=4))
        alone = mgr.submit(_request(stories_path, prompts=5))
        mgr.watch(shared.key, "left")
        mgr.watch(shared.key, "stays")
        mgr.watch(alone.key, "alone")
        alive["left"] = alive["alone"] = False       # two tabs closed
        assert alone.wait(120)                        # the monitor looks every 2 s, the grace is 0.3 s
        assert alone.status == CANCELLED and "left" in alone.error
        assert shared.running
        gate.set()
        assert shared.wait(120) and shared.status == DONE
    finally:
        gate.set()
        mgr.shutdown()


# ----------------------------------------------------------------------------------------------- the page
def test_the_page_says_when_the_server_is_busy_and_queues_nothing(cache, monkeypatch):
    """AppTest: a demo server whose queue is full answers Compute with one message that says what to do, and
    submits nothing; a visitor who asks for what another already computes joins it (never refused)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from support.app_util import APP, STORIES_REL, TIMEOUT

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", STORIES_REL)
    monkeypatch.setenv("SWAPKL_DEMO_MAX_QUEUED", "0")
    from dashboard import common

    st.cache_resource.clear()
    try:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        at.number_input(key="w_prompts").set_value(4)
        at.number_input(key="w_tokens").set_value(16)
        at.number_input(key="w_budget").set_value(0).run()
        at.button(key="compute").click().run()
        assert not at.exception
        assert any("the server is busy" in e.value and "Try again in a few minutes" in e.value for e in at.error), \
            [e.value for e in at.error]
        assert common.manager().jobs() == []
    finally:  # the demo policy and manager are cached resources: a later AppTest in this process must not see them
        common.manager().shutdown()
        st.cache_resource.clear()


def test_an_abandoned_running_job_is_cancelled_and_logged_once(caplog):
    """A running job stops at its next check, which may be seconds away: the monitor asks once, not every pass."""
    import logging
    import threading
    import time

    from swapkl.jobs.manager import monitor

    class FakeJob:
        key, cancels = "job", 0

        @property
        def cancel_requested(self):
            return self.cancels > 0

        def note(self, msg):
            pass

    class FakeManager:
        _closed = False
        job = FakeJob()

        def active(self):
            return [self.job]  # still running after the cancel: it has not reached its next check

        class audience:
            @staticmethod
            def abandoned(key):
                return True

        def cancel(self, key, reason=""):
            self.job.cancels += 1

    mgr = FakeManager()
    with caplog.at_level(logging.INFO, logger="swapkl.jobs"):
        t = threading.Thread(target=monitor, args=(mgr, 0.01))
        t.start()
        time.sleep(0.2)      # about 20 passes of the monitor
        mgr._closed = True
        t.join(5)
    assert mgr.job.cancels == 1
    assert sum("cancelled, nobody waits for it" in r.getMessage() for r in caplog.records) == 1
