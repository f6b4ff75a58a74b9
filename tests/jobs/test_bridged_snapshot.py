"""A repaired analysis's snapshot keeps its third matrix: a restarted app serves the bridged heatmap from it without
the model, and an older snapshot without it (or with a damaged one) is computed again rather than served without it."""
from __future__ import annotations

import pytest

from swapkl.contract import Contract

BRIDGE = {"form": "folded", "calib_tokens": 256, "calib_window": 64}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _request(stories_path, **kw):
    from swapkl.jobs import AnalysisRequest

    return AnalysisRequest(**(dict(model=str(stories_path), contract=Contract(pairs="adjacent", prompts=2, tokens=16),
                                   budget=0, repair="bridge", bridge=BRIDGE) | kw))


def _no_model(*a, **k):
    pytest.fail("a cached request must not load the model")


def test_the_bridged_matrix_is_served_from_the_snapshot(cache, stories_path):
    from swapkl.jobs import DONE, JobManager
    from swapkl.store import read_entry, write_entry

    m = JobManager()
    job = m.submit(_request(stories_path))
    assert job.wait(180) and job.status == DONE, job.error
    m.shutdown()
    spans = {tuple(s["span"]): sum(s["bridged"]) / len(s["bridged"]) for s in job.bridged["spans"]}
    assert (1, 2) in spans and spans[(1, 2)] > 0

    m2 = JobManager(loader=_no_model)
    j2 = m2.submit(_request(stories_path))
    assert j2.status == DONE and j2.from_snapshot
    assert {tuple(s["span"]): sum(s["bridged"]) / len(s["bridged"]) for s in j2.bridged["spans"]} == spans
    m2.shutdown()

    plain = JobManager()
    jp = plain.submit(_request(stories_path, repair="none", bridge={}))
    assert jp.wait(180) and jp.status == DONE and jp.bridged is None
    plain.shutdown()
    again = JobManager(loader=_no_model).submit(_request(stories_path, repair="none", bridge={}))
    assert again.from_snapshot and again.bridged is None  # an unrepaired analysis needs no third matrix

    # a snapshot written before the third matrix was kept, and one with a damaged matrix: computed again
    snap = cache / "dashboard" / job.key / "snapshot.json"
    for damage in (lambda d: d.pop("bridged"), lambda d: d["bridged"].update(num_layers=-3)):
        data = read_entry(snap, "job-snapshot")
        damage(data)
        write_entry(snap, "job-snapshot", data)
        m3 = JobManager()
        j3 = m3.submit(_request(stories_path))
        assert not j3.from_snapshot and j3.wait(180) and j3.status == DONE
        assert {tuple(s["span"]): sum(s["bridged"]) / len(s["bridged"]) for s in j3.bridged["spans"]} == pytest.approx(spans)
        m3.shutdown()
        assert isinstance(read_entry(snap, "job-snapshot")["bridged"], dict)  # rewritten whole
