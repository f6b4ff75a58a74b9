"""The dashboard's job manager: identical requests share a job, results equal the library's, snapshots serve a
cached request without loading the model, cancel keeps finished pairs, errors become one readable line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.contract import Contract
from swapkl.measure.evaluate import Evaluator
from swapkl.removal.plan import RemovalPlan

QUICK_EV = Evaluator("quick-test", max_words=400, window=64, stride=32)
CONTRACT = Contract(pairs="gap:2", prompts=4, tokens=16, device="cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def manager(cache):
    from swapkl.jobs import JobManager

    m = JobManager()
    yield m
    m.shutdown()


def _request(stories_path, **kw):
    from swapkl.jobs import AnalysisRequest

    args = dict(model=str(stories_path), contract=CONTRACT, budget=2,
                methods=("replacement", "interchange", "random"), evaluator=QUICK_EV)
    return AnalysisRequest(**(args | kw))


def test_analysis_job_matches_library_and_is_shared(manager, stories_path, cache):
    from swapkl.scoring.score import score
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.jobs import DONE, JobManager
    from swapkl.removal.curves import removal_curves

    req = _request(stories_path)
    job = manager.submit(req)
    assert manager.submit(_request(stories_path)) is job          # identical request -> the same job
    assert job.wait(120), job.summary()
    assert job.status == DONE, job.error
    res, curves = job.result, job.curves
    # gap:2 on a 5-layer model: 4 adjacent + 3 distance-2 pairs, adjacent first
    assert res.pairs == [(0, 1), (1, 2), (2, 3), (3, 4), (0, 2), (1, 3), (2, 4)]
    assert set(curves.methods) == {"replacement", "interchange", "random"}
    assert curves.verdict["regime"] in ("divergent", "tied", "weak")
    p = job.progress()
    assert (p.step, p.steps) == (4, 4) and p.done == p.total and p.fraction == 1.0

    # the library, called directly, gives the same numbers (matrices from the cache, curves recomputed)
    ck = load_checkpoint(str(stories_path), device="cpu")
    direct = score(ck, CONTRACT)
    np.testing.assert_allclose(res.replacement(), direct.replacement(), equal_nan=True)
    np.testing.assert_allclose(res.interchange(), direct.interchange(), equal_nan=True)
    dc = removal_curves(ck.model, ck.tokenizer, {"replacement": direct.replacement(), "interchange": direct.interchange()}, RemovalPlan(budget=2, methods=("replacement", "interchange", "random"), evaluator=QUICK_EV))
    assert curves.baseline_ppl == pytest.approx(dc.baseline_ppl, rel=1e-6)
    for m in dc.methods:
        assert [e["removed"] for e in curves.methods[m]] == [e["removed"] for e in dc.methods[m]]
        assert [e["ppl"] for e in curves.methods[m]] == pytest.approx([e["ppl"] for e in dc.methods[m]], rel=1e-6)

    # a new manager (a restarted app) serves the request from the snapshot, without loading the model
    m2 = JobManager(loader=lambda *a, **k: pytest.fail("a cached request must not load the model"))
    j2 = m2.submit(_request(stories_path))
    assert j2.status == DONE and j2.from_snapshot
    np.testing.assert_allclose(j2.result.replacement(), res.replacement(), equal_nan=True)
    assert j2.curves.methods["interchange"][0]["ppl"] == pytest.approx(curves.methods["interchange"][0]["ppl"])
    saved = json.loads((cache / "dashboard" / job.key / "snapshot.json").read_text())["data"]["request"]
    assert saved["contract"]["pairs"] == "gap:2" and saved["budget"] == 2
    # a damaged snapshot is not used: the request is computed again (and the snapshot rewritten)
    snap = cache / "dashboard" / job.key / "snapshot.json"
    snap.write_text(snap.read_text().replace('"gap:2"', '"gap:3"', 1))
    m3 = JobManager()
    j3 = m3.submit(_request(stories_path))
    assert not j3.from_snapshot and j3.wait(120) and j3.status == DONE
    assert json.loads(snap.read_text())["data"]["request"]["contract"]["pairs"] == "gap:2"


def test_different_requests_get_different_jobs(manager, stories_path):
    a = _request(stories_path, budget=0)
    b = _request(stories_path, budget=0, contract=CONTRACT.with_(seed=1))
    from swapkl.jobs import request_key

    assert request_key(a) != request_key(b)
    assert request_key(a) == request_key(_request(stories_path, budget=0))
    ja = manager.submit(a)
    assert ja.wait(60) and ja.status == "done" and ja.curves is None
    # the loaded model is reused for the second job (LRU), not loaded again
    loads = []
    manager.models.loader = lambda *x, **k: loads.append(x) or pytest.fail("should come from the LRU")
    jb = manager.submit(b)
    assert jb.wait(60) and jb.status == "done", jb.error
    assert loads == [] and len(manager.loaded_models()) == 1


def test_cancel_keeps_finished_pairs(manager, stories_path, monkeypatch, cache):
    import swapkl.scoring.score as api

    real = api.score
    calls = {"n": 0}

    def score_that_cancels(ck, contract, progress=None, should_stop=None, on_partial=None, **kw):
        def partial(res):
            on_partial(res)
            calls["n"] += 1
            if calls["n"] == 2:                  # two pairs finished: the user presses cancel
                manager.cancel(manager.jobs()[0].key)
        return real(ck, contract, progress=progress, should_stop=should_stop, on_partial=partial, **kw)

    monkeypatch.setattr(api, "score", score_that_cancels)
    job = manager.submit(_request(stories_path, budget=0, contract=CONTRACT.with_(pairs="all")))
    assert job.wait(60)
    assert job.status == "cancelled" and "kept" in job.error
    kept = len(job.result.pairs)                         # the partial result survives on the job
    assert kept == 2                                     # the engine polls should_stop between chunks of pairs
    on_disk = list((cache / "scores").glob("*/pairs/chunk-*.json"))
    stored = sorted(tuple(p) for f in on_disk for p in json.loads(f.read_text())["data"]["pairs"])
    assert stored == [(0, 1), (1, 2)]  # finished pairs stay in the score cache
    monkeypatch.setattr(api, "score", real)
    # a retry is a new job that reuses the two cached pairs
    again = manager.submit(_request(stories_path, budget=0, contract=CONTRACT.with_(pairs="all")))
    assert again is not job
    assert again.wait(60) and again.status == "done"
    assert len(again.result.pairs) == 10 and again.key == job.key
    assert again.result.meta["cached_pairs"] == 4          # the wider step reuses the adjacent pairs


def test_errors_are_one_line_and_the_manager_keeps_working(manager, stories_path, tmp_path, cache):
    import torch

    from swapkl.jobs import ERROR, AnalysisRequest

    # a path that does not exist: fails at once, readable
    bad = manager.submit(AnalysisRequest(model=str(tmp_path / "nope"), contract=CONTRACT))
    assert bad.status == ERROR and "no such file or folder" in bad.error and "\n" not in bad.error
    # an unsupported architecture: the library's message
    from swapkl.model.tiny import tiny_model

    tiny_model("hrm_text").save_pretrained(tmp_path / "opt")  # its block lists run in loops: refused
    j = manager.submit(AnalysisRequest(model=str(tmp_path / "opt"), contract=CONTRACT))
    assert j.wait(60) and j.status == ERROR and j.error_kind == "user"
    assert j.error.startswith("unsupported architecture: hrm_text")
    # out of memory and an unexpected bug: one line each, the bug's traceback goes to the log file
    manager.models.loader = lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory. Tried"))
    j = manager.submit(_request(stories_path, budget=0))
    assert j.wait(60) and j.error_kind == "oom" and j.error.startswith("out of memory while loading")
    manager.models.loader = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom\nsecond line"))
    j2 = manager.submit(_request(stories_path, budget=0))      # the failed request is retried as a new job
    assert j2 is not j and j2.wait(60) and j2.error_kind == "bug"
    assert "RuntimeError: boom" in j2.error and "\n" not in j2.error and "dashboard.log" in j2.error
    assert "Traceback" in (cache / "logs" / "dashboard.log").read_text()
    # the manager still runs a good job afterwards
    manager.models.loader = None
    ok = manager.submit(_request(stories_path, budget=0))
    assert ok.wait(60) and ok.status == "done" and len(ok.result.pairs) == 7


def test_budget_error_keeps_the_scores(manager, stories_path):
    # 5 layers, candidates 1..3, spacing 1: at most 2 layers can go; budget 3 fails in the curves step only
    job = manager.submit(_request(stories_path, budget=3, methods=("replacement",)))
    assert job.wait(60) and job.status == "error" and job.error_kind == "user"
    assert "budget 3" in job.error and job.result is not None and len(job.result.pairs) == 7


def test_trajectory_job(manager, tmp_path, stories_path):
    import shutil

    from swapkl.jobs import TrajectoryRequest

    folder = tmp_path / "run"
    for step in (0, 10):
        shutil.copytree(stories_path, folder / f"checkpoint-{step}")
    req = TrajectoryRequest(str(folder), Contract(prompts=3, tokens=12, device="cpu"))
    job = manager.submit(req)
    assert job.wait(120) and job.status == "done", job.error
    stats = job.trajectory.summary()
    assert list(stats["step"]) == [0, 10] and list(stats["pairs"]) == [4, 4]
    # identical weights at both steps: identical statistics
    assert stats["gap_mean"].iloc[0] == pytest.approx(stats["gap_mean"].iloc[1])
    assert job.progress().fraction == 1.0
    # a restarted app serves it from the snapshot: the same checkpoints and statistics
    from swapkl.jobs import JobManager

    again = JobManager().submit(req)
    assert again.status == "done" and again.from_snapshot and again.result is not None
    assert [s.display() for s in again.trajectory.specs] == [s.display() for s in job.trajectory.specs]
    assert list(again.trajectory.summary()["gap_mean"]) == pytest.approx(list(stats["gap_mean"]))


def test_demo_trajectory_job_trains_then_scores(manager, tmp_path, stories_path, monkeypatch):
    import shutil

    from swapkl.trajectory import demo as demo_trajectory
    from swapkl.jobs import TrajectoryRequest

    calls = []

    def fake_train(out, progress=None, should_stop=None, **kw):   # the real one trains for ~3 minutes
        calls.append(out)
        for step in (0, 4, 16):
            shutil.copytree(stories_path, f"{out}/step{step}")
            progress(step, 16, f"step {step}")
        return out

    monkeypatch.setattr(demo_trajectory, "train_demo_trajectory", fake_train)
    out = tmp_path / "demo"
    job = manager.submit(TrajectoryRequest(str(out), Contract(prompts=3, tokens=12, device="cpu"), train_demo=True))
    assert job.wait(120) and job.status == "done", job.error
    assert calls == [str(out)] and job.progress().steps == 2
    assert list(job.trajectory.summary()["step"]) == [0, 4, 16]


def test_defaults_per_device():
    from swapkl.removal import methods
    from swapkl.jobs.defaults import DEFAULT_BUDGET, default_contract, default_evaluator
    from swapkl.measure.evaluate import make_windows

    cpu = default_contract("cpu")
    assert (cpu.pairs, cpu.prompts, cpu.tokens, cpu.positions, cpu.device) == ("adjacent", 16, 32, "all", "cpu")
    ev = default_evaluator("cpu")
    assert (ev.name, ev.max_words, ev.window, ev.stride) == ("quick", 600, 256, 192)
    # ~800 tokens of text: 4 windows, every token after the first scored exactly once
    wins = make_windows(801, ev.window, ev.stride)
    assert len(wins) == 4 and sum(w.n_scored for w in wins) == 800
    gpu = default_contract("cuda")
    assert (gpu.prompts, gpu.tokens, gpu.device, gpu.pairs) == (64, 128, "cuda", "gap:3")
    assert default_evaluator("cuda").name == "matched"
    assert DEFAULT_BUDGET == 4 and methods.default_set("dashboard") == ("replacement", "interchange", "random")


def test_job_owns_its_transitions():
    """queued -> running -> done through the job's own methods; a cancel before start ends it at start."""
    from swapkl.jobs import CANCELLED, DONE, QUEUED, RUNNING, AnalysisRequest, Job

    job = Job("k1", AnalysisRequest("default"))
    assert job.status == QUEUED and job.running and not job.should_stop()
    assert job.start() and job.status == RUNNING and job.started is not None
    job.phase(1, 2, "scoring", total=10)
    job.tick(4, 10, "pair 0-1")
    p = job.progress()
    assert (p.step, p.steps, p.done, p.total, p.what) == (1, 2, 4, 10, "pair 0-1")
    job.finish(DONE)
    assert job.status == DONE and not job.running and job.wait(0) and job.progress().done == 10
    late = Job("k2", AnalysisRequest("default"))
    late.request_cancel()
    assert late.should_stop() and not late.start()
    assert late.status == CANCELLED and late.error == "cancelled before it started"
    snap = Job("k3", AnalysisRequest("default"))
    before = dict(snap.updates)
    snap.done_from("loaded from the cache", result="R")
    assert snap.status == DONE and snap.from_snapshot and snap.result == "R"
    assert snap.updates["result"] == before["result"] + 1 and snap.updates["curves"] == before["curves"]


def test_one_oom_classifier():
    import torch

    from swapkl.scoring.engine import DeviceOutOfMemory
    from swapkl.errors import is_oom
    from swapkl.jobs import readable_error

    assert is_oom(MemoryError()) and is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(RuntimeError("CUDA error: out of memory")) and not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(DeviceOutOfMemory("out of memory even at batch 1"))  # already explained: not retried
    assert not is_oom(ValueError("out of memory"))
    assert readable_error(MemoryError(), "scoring", None)[1] == "oom"
    assert readable_error(DeviceOutOfMemory("out of memory even at batch 1"), "scoring", None)[1] == "user"


def test_engine_does_not_retry_what_halving_cannot_fix():
    from swapkl.scoring import engine

    calls = []

    def fn(a, b):
        calls.append((a, b))
        raise engine.DeviceOutOfMemory("already at one row")

    bc = engine.BatchController(8)
    with pytest.raises(engine.DeviceOutOfMemory):
        bc.map(fn, 8)
    assert calls == [(0, 8)] and bc.max_rows == 8


def test_is_oom_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys; from swapkl.errors import is_oom; is_oom(RuntimeError('x')); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
