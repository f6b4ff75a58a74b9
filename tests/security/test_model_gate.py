"""Issue 51, the one gate: on a demo server every path that loads or exports a model passes the policy where the
checkpoint is resolved (the job manager's model cache), so an opened file, a crafted request or a new pipeline
cannot walk around the allow-list; an opened file is browse-only unless its model is listed, and then the listed
model is loaded, never a path from the file.  Refusals are one line that names no server path."""
from __future__ import annotations

import copy
import json

import pytest
from streamlit.testing.v1 import AppTest

from support.app_util import APP, ROOT, STORIES_REL, TIMEOUT

from swapkl.contract import Contract
from swapkl.errors import PolicyError
from swapkl.measure.evaluate import Evaluator

QUICK_EV = Evaluator("quick-test", max_words=400, window=64, stride=32)
CONTRACT = Contract(pairs="adjacent", prompts=4, tokens=16, device="cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory, stories_path):
    """A result file and its curves file of stories260K, computed on a local (non-demo) server, as a colleague
    would send them: the identity names the folder by its absolute path."""
    from swapkl.jobs import AnalysisRequest, JobManager

    tmp = tmp_path_factory.mktemp("files")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWAPKL_CACHE", str(tmp / "cache"))
        mgr = JobManager(root=tmp / "dash")
        job = mgr.submit(AnalysisRequest(model=str(stories_path), contract=CONTRACT, budget=1,
                                         methods=("replacement", "interchange"), evaluator=QUICK_EV))
        assert job.wait(300) and job.status == "done", job.summary()
        mgr.shutdown()
    return job.result.to_dict(), job.curves.to_dict()


def _with_identity(result: dict, **ident) -> dict:
    out = copy.deepcopy(result)
    out["model"] = {**out["model"], **ident}
    return out


def _demo(monkeypatch, models: str):
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", models)
    st.cache_resource.clear()


def _no_server_path(text: str, *paths) -> bool:
    return not any(str(p) in text for p in (ROOT, ROOT.parent, *paths)) and "/etc" not in text


def test_an_opened_file_of_an_unlisted_folder_is_browse_only_and_never_loaded(cache, monkeypatch, files,
                                                                              stories_path, tmp_path):
    """The issue's high case: a results file whose identity names a folder off the allow-list, opened, then Export
    pressed on the Removal curves page.  Now: no export is offered, nothing is written under exports/, the model is
    never loaded, and the library route (what the button called) is refused in one line naming no path."""
    _demo(monkeypatch, "default")
    result, curves = files
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    from dashboard import common

    mgr = common.manager()
    job = mgr.open_files(json.dumps(result), json.dumps(curves), owner=at.session_state["_session"])
    assert job.browse_only and "/" not in job.request.model
    at.session_state["job_analysis"] = job.key
    at.session_state["job_pinned"] = job.key
    at.run()
    at.switch_page("pages/curves.py").run()
    assert not at.exception, at.exception
    assert not [b for b in at.button if b.key == "export"]  # no export button for a browse-only file
    assert not (cache / "exports").exists()
    with pytest.raises(PolicyError) as e:
        mgr.export_pruned(job, [1], tmp_path / "out")
    assert "\n" not in str(e.value) and _no_server_path(str(e.value), stories_path)
    assert not (tmp_path / "out").exists() and not (cache / "exports").exists()
    assert mgr.models.loads == 0 and mgr.loaded_models() == []


@pytest.mark.parametrize("where", ["/etc", "/nonexistent/x", "https://example.org/x.gguf"])
def test_the_refusal_is_the_same_whatever_the_file_names(cache, monkeypatch, files, where, tmp_path):
    """A file whose identity names /etc, a missing path or anything else gets the same one line: the server no
    longer answers which of its paths exist ("no config.json", "no such file")."""
    _demo(monkeypatch, "default")
    from dashboard import common

    mgr = common.manager()
    job = mgr.open_files(_with_identity(files[0], kind="local", id=where, display=where, fingerprint="x"),
                         owner="visitor")
    assert job.browse_only
    with pytest.raises(PolicyError) as e:
        mgr.export_pruned(job, [1], tmp_path / "out")
    msg = str(e.value)
    assert msg == "this demo server offers only these checkpoints: default", msg
    assert mgr.models.loads == 0


def test_an_opened_file_of_a_listed_folder_loads_the_listed_one(cache, monkeypatch, files, stories_path):
    """The file's model is on the list (same content fingerprint, computed elsewhere under another path): the job
    names the allow-list's entry, never the file's path; a file that claims the listed fingerprint under another
    path still loads only the listed folder."""
    _demo(monkeypatch, f"default,{STORIES_REL}")
    from dashboard import common

    mgr = common.manager()
    job = mgr.open_files(files[0], files[1], owner="visitor")
    assert files[0]["model"]["id"] == str(stories_path) and not job.browse_only
    assert job.request.model == STORIES_REL and job.request.revision is None
    forged = mgr.open_files(_with_identity(files[0], id="/etc"), files[1], owner="visitor")
    assert not forged.browse_only and forged.request.model == STORIES_REL
    ck = mgr.checkpoint_for(forged.request.model, None, "float32", "cpu")
    assert ck.identity["fingerprint"] == files[0]["model"]["fingerprint"] and mgr.models.loads == 1


def test_a_local_server_keeps_the_files_own_model(cache, files, stories_path):
    """Nothing changes for a local user: the opened job names the file's own folder and exports it."""
    from dashboard import common

    job = common.manager().open_files(files[0], files[1], owner="me")
    assert not job.browse_only and job.request.model == str(stories_path)


class Recorder:
    """A loader that records every call and loads nothing (a test that a refused request never reaches it)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *a, **k):
        self.calls.append((a, k))
        raise AssertionError("the gate let a load through")


def _requests():
    from swapkl.jobs import AnalysisRequest, EvidenceRequest, TrajectoryRequest
    from swapkl.jobs.requests import CompareRequest
    from swapkl.jobs.studies import study_request

    return {"analysis": AnalysisRequest(model="/etc", contract=CONTRACT, budget=1, evaluator=QUICK_EV),
            "evidence": EvidenceRequest(model="/etc", contract=CONTRACT, budget=1),
            "compare": CompareRequest(model_a="/etc", model_b="default", contract=CONTRACT),
            "trajectory": TrajectoryRequest("/etc /root", CONTRACT),
            "study": study_request("/etc\ndefault", CONTRACT, 1, 400, 100)}


@pytest.mark.parametrize("kind", ["analysis", "evidence", "compare", "trajectory", "study"])
def test_every_pipeline_loads_through_the_gate(kind, monkeypatch, tmp_path):
    """Each pipeline run directly with a request naming /etc (as a new page that forgot the policy would): the gate
    in the model cache refuses it before the loader is called."""
    from swapkl.jobs import Job, JobManager
    from swapkl.jobs.policy import Policy
    from swapkl.jobs.runner import _pipeline

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    rec = Recorder()
    mgr = JobManager(root=tmp_path / "d", loader=rec, policy=Policy(demo=True, models=("default",)))
    mgr.models.loader = rec
    request = _requests()[kind]
    with pytest.raises(PolicyError, match="offers only these checkpoints: default"):
        _pipeline(Job("k", request), mgr.models)
    assert rec.calls == []
    with pytest.raises(PolicyError):  # and the manager refuses it before fingerprinting the path
        mgr.submit(request)
    assert mgr.jobs() == []


def test_the_gate_checks_cached_models_too(tmp_path):
    """A model another request loaded is not served to a request the policy refuses (the check runs on every get)."""
    from swapkl.jobs.models import ModelCache
    from swapkl.jobs.policy import Policy

    pol = Policy(demo=True, models=("default",))
    loaded = []
    cache = ModelCache(2, loader=lambda m, **k: loaded.append(m) or object(), policy=pol)
    first = cache.get("default", None)
    assert cache.get("default", None) is first and loaded == ["default"]
    cache.policy = Policy(demo=True, models=("EleutherAI/pythia-160m",))
    with pytest.raises(PolicyError):
        cache.get("default", None)
    with pytest.raises(PolicyError):
        cache.load("/etc")
    with pytest.raises(PolicyError):
        cache.check_list("EleutherAI/pythia-160m /etc")
    assert cache.load("/server/own/demo-trajectory/step1", own=True) is not None  # the server's own folder
    assert loaded == ["default", "/server/own/demo-trajectory/step1"]
