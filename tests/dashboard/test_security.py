"""The dashboard shown to colleagues: demo mode (allow-listed checkpoints, no typed path, exports only below
cache/exports, bounded jobs per session), private opened files, and a loopback-only default server."""
from __future__ import annotations

import os
import threading

import pytest

from streamlit.testing.v1 import AppTest

from swapkl.contract import Contract

from support.app_util import APP, ROOT, STORIES_REL, TIMEOUT, wait_export


@pytest.fixture
def demo(cache, monkeypatch):
    """Demo mode with the built-in default and stories260K on the allow-list."""
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", f"default,{STORIES_REL}")
    st.cache_resource.clear()
    return cache


def _texts(at) -> list[str]:
    return [t.label for t in at.text_input] + [t.label for t in at.text_area]


def test_demo_mode_offers_no_typed_path_and_refuses_a_crafted_link(demo):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["model"] = "/etc/passwd"          # a crafted deep link
    at.run()
    assert not at.exception
    # the checkpoint is a choice among the allow-list; nothing on the page takes a path
    assert at.selectbox(key="w_demo_model").options == ["Built-in default (SmolLM2-135M-Instruct)", STORIES_REL]
    assert at.selectbox(key="w_demo_model").value == "default"      # the link's path was ignored
    assert not any("path" in lab.lower() or "folder" in lab.lower() or "gguf" in lab.lower() for lab in _texts(at))
    assert not [r for r in at.radio if r.key == "w_source"]
    # the pair set offered is bounded, and an oversized contract is refused before anything is submitted
    assert "all" not in at.selectbox(key="w_pairs").options
    at.number_input(key="w_prompts").set_value(512)
    at.number_input(key="w_tokens").set_value(512).run()
    assert any("at most 4096 prompt tokens" in e.value for e in at.error)
    assert at.button(key="compute").disabled
    # a request the widgets cannot build (a typed path) is refused by the policy in the library call too
    from dashboard import common
    from swapkl.jobs import AnalysisRequest
    from swapkl.jobs.policy import PolicyError

    with pytest.raises(PolicyError, match="offers only these checkpoints"):
        common.policy().check_request(AnalysisRequest(model="/etc", contract=Contract()))
    assert common.manager().jobs() == []


def test_demo_trajectory_list_is_checked(demo):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/trajectory.py").run()
    assert not at.exception
    area = [t for t in at.text_area][0]
    area.set_value("/etc /root").run()
    assert at.button(key="compute_traj").disabled  # refused before it can be pressed
    assert not at.exception
    assert any("offers only these checkpoints" in e.value for e in at.error), [e.value for e in at.error]
    from dashboard import common

    assert common.manager().jobs() == []


def test_demo_export_only_below_cache_exports(demo, tmp_path):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="w_demo_model").set_value(STORIES_REL)
    at.number_input(key="w_prompts").set_value(4)
    at.number_input(key="w_tokens").set_value(16)
    at.number_input(key="w_budget").set_value(1)
    at.run()
    at.button(key="compute").click().run()
    from dashboard import common

    job = common.manager().get(at.session_state["job_analysis"])
    assert job is not None and job.wait(180) and job.status == "done", job.summary()
    at.switch_page("pages/curves.py").run()
    assert not at.exception
    assert not [t for t in at.text_input if t.label == "output folder"]   # no folder typed in the browser
    at.button(key="export").click().run()
    wait_export(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    exports = demo / "exports"
    made = [p for p in exports.iterdir() if p.is_dir()]
    assert len(made) == 1 and (made[0] / "config.json").is_file() and (made[0] / "swapkl_prune.json").is_file()
    assert any(b.label == "⬇ pruned model (zip)" for b in at.get("download_button"))
    # pressing it again reuses the same server-derived folder, nothing else appears anywhere
    at.button(key="export").click().run()
    assert [p for p in exports.iterdir() if p.is_dir()] == made
    assert not [p for p in tmp_path.rglob("config.json") if exports not in p.parents and "models" not in p.parts
                and "stories260K" not in str(p) and "dashboard" not in p.parts]


class _Blocking:
    """A loader that holds every job in 'loading' until released."""

    def __init__(self):
        self.go = threading.Event()

    def __call__(self, *a, **k):
        self.go.wait(30)
        from swapkl.errors import ModelLoadError

        raise ModelLoadError("released")


def test_jobs_per_session_are_bounded(cache):
    from swapkl.jobs import AnalysisRequest, JobManager
    from swapkl.jobs.policy import PolicyError

    gate = _Blocking()
    mgr = JobManager(loader=gate, use_snapshots=False)
    try:
        reqs = [AnalysisRequest(model=STORIES_REL, contract=Contract(prompts=4 + k, tokens=16)) for k in range(4)]
        a = mgr.submit(reqs[0], owner="A", max_active=2)
        b = mgr.submit(reqs[1], owner="A", max_active=2)
        assert a.running and b.running
        with pytest.raises(PolicyError, match="already have 2 computations queued or running"):
            mgr.submit(reqs[2], owner="A", max_active=2)
        assert mgr.submit(reqs[0], owner="A", max_active=2) is a   # joining an identical job costs nothing
        c = mgr.submit(reqs[2], owner="B", max_active=2)            # another session is not affected
        assert c.running
        gate.go.set()
        assert a.wait(30) and b.wait(30) and c.wait(30)
        d = mgr.submit(reqs[3], owner="A", max_active=2)             # slots free again once they finished
        assert d.wait(30) and d.status == "error"
    finally:
        gate.go.set()
        mgr.shutdown()


def test_an_opened_file_is_private_to_its_session(cache, stories_path, tmp_path):
    from swapkl.scoring.score import score
    from swapkl.model.checkpoints import load_checkpoint
    from dashboard import common

    ck = load_checkpoint(str(stories_path), device="cpu")
    res = score(ck, Contract(pairs="adjacent", prompts=3, tokens=8, device="cpu"))
    data = res.to_json().encode()
    a = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    owner = a.session_state["_session"]
    job = common.manager().open_files(data, owner=owner)
    assert job.owner == owner
    # another visitor's fresh session does not get it as its "last analysis", and cannot fetch it by key
    b = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not b.exception
    assert any("Nothing computed yet" in i.value for i in b.info)
    assert b.session_state["_session"] != owner
    assert common.manager().get(job.key, viewer=b.session_state["_session"]) is None
    assert job not in common.manager().jobs(viewer=b.session_state["_session"])
    # its own session sees it
    a.session_state["job_analysis"] = job.key
    a.session_state["job_pinned"] = job.key
    a.run()
    assert not a.exception and any("Done" in s.value for s in a.success)


@pytest.mark.server
def test_default_server_listens_on_loopback_only(tmp_path, stories_path):
    """The shipped .streamlit/config.toml binds the server to 127.0.0.1: read the kernel's socket table (no
    traffic is sent to any non-loopback address)."""
    from support.browser_util import free_port, listening_addresses, served, streamlit_cmd

    port = free_port()
    env = dict(os.environ, SWAPKL_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    with served(streamlit_cmd(port), ROOT, env, tmp_path / "server.log", port, timeout=90):
        addrs = listening_addresses(port)
    assert addrs and all(a in ("127.0.0.1", "::1") for a in addrs), addrs
    log = (tmp_path / "server.log").read_text()
    assert "Network URL" not in log   # streamlit prints one only when it listens beyond loopback
