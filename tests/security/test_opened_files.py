"""Opened files are bounded per browser session (issue 51): a visitor who opens file after file keeps at most
``policy.max_opened`` of them (demo 4, local 32), the least recently used dropped first; opening or viewing one is
a use.  Measured through the Compare page's multi-file uploader and on the job manager (count and traced memory)."""
from __future__ import annotations

import gc
import tracemalloc

import pytest

from swapkl.jobs import JobManager
from swapkl.jobs.policy import LOCAL_MAX_OPENED, Policy
from support.app_util import APP, STORIES_REL, TIMEOUT
from test_compare import synthetic


@pytest.fixture
def demo(cache, monkeypatch):
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", f"default,{STORIES_REL}")
    st.cache_resource.clear()
    return cache


def _files(n: int, L: int = 6, P: int = 6, start: int = 0) -> list[bytes]:
    return [synthetic(L=L, P=P, seed=start + k).to_json().encode() for k in range(n)]


def _shown(mgr, viewer) -> list[str]:
    return sorted(j.result.identity["display"] for j in mgr.jobs(viewer=viewer))


def test_forty_files_opened_at_once_on_the_compare_page_keep_four_in_demo_mode(demo):
    from streamlit.testing.v1 import AppTest

    from dashboard import common

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/compare.py").run()
    up = at.file_uploader(key="cmp_open")
    up.set_value([(f"r{k}.json", data, "application/json") for k, data in enumerate(_files(40))]).run()
    at.button(key="cmp_open_button").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    me = at.session_state["_session"]
    mgr = common.manager()
    assert mgr.policy.max_opened == 4
    assert _shown(mgr, me) == ["m36", "m37", "m38", "m39"]  # the four opened last
    assert len(mgr.jobs()) == 4  # the other 36 are gone from the server, not only hidden
    assert at.selectbox(key="cmp_a").options and len(at.selectbox(key="cmp_a").options) == 4
    # another visitor's files do not push this one's out
    other = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    for data in _files(2, start=100):
        mgr.open_files(data, owner=other.session_state["_session"])
    assert _shown(mgr, me) == ["m36", "m37", "m38", "m39"]
    assert _shown(mgr, other.session_state["_session"]) == ["m100", "m101"] and len(mgr.jobs()) == 6


def test_viewing_a_file_keeps_it_and_the_least_recently_used_goes(cache_dir):
    mgr = JobManager(policy=Policy(demo=True), use_snapshots=False)
    a, b, c, d = (mgr.open_files(x, owner="s1") for x in _files(4))
    assert mgr.get(a.key, viewer="s1") is a  # viewing A is a use: B is now the least recently used
    e = mgr.open_files(_files(1, start=4)[0], owner="s1")
    assert mgr.get(b.key) is None and b not in mgr.jobs()
    assert [mgr.get(j.key, viewer="s1") for j in (a, c, d, e)] == [a, c, d, e]
    assert mgr.open_files(_files(1, start=2)[0], owner="s1") is c  # opening a kept file again is a use, not a copy
    again = mgr.open_files(_files(1, start=1)[0], owner="s1")  # B's file opened again is rebuilt, A (oldest) goes
    assert again is not b and again.key == b.key and mgr.get(a.key) is None
    assert len(mgr.jobs(viewer="s1")) == 4
    assert mgr.get(c.key, viewer="s2") is None  # another session neither sees nor touches it


def test_a_local_server_keeps_32_and_refuses_none(cache_dir):
    mgr = JobManager(use_snapshots=False)
    files = _files(40)
    jobs = [mgr.open_files(x, owner="me") for x in files[:LOCAL_MAX_OPENED]]
    assert len(mgr.jobs(viewer="me")) == LOCAL_MAX_OPENED == 32
    assert all(mgr.get(j.key, viewer="me") is j for j in jobs)  # every one of 32 is kept locally
    for x in files[LOCAL_MAX_OPENED:]:
        mgr.open_files(x, owner="me")
    assert len(mgr.jobs()) == 32 and _shown(mgr, "me") == sorted(f"m{k}" for k in range(8, 40))


def _retained(mgr_files, owner="visitor") -> tuple[int, int]:
    """Traced bytes held after opening each of ``mgr_files`` in one session, measured after the 4th and the last."""
    mgr = JobManager(policy=Policy(demo=True), use_snapshots=False)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        after4 = None
        for k, data in enumerate(mgr_files):
            mgr.open_files(data, owner=owner)
            if k == 3:
                gc.collect()
                after4 = tracemalloc.get_traced_memory()[0] - base
        gc.collect()
        after_all = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(mgr.jobs()) == 4
    return after4, after_all


def test_memory_held_after_forty_opened_files_is_that_of_four(cache_dir):
    files = _files(40, L=16, P=24)
    size = len(files[0])
    after4, after40 = _retained(files)
    # four opened files hold a few times their size; forty hold no more than four (plus noise), not ten times it
    assert after4 > 4 * size // 2, (after4, size)
    assert after40 < 1.5 * after4, (after4, after40, size)
    print(f"file {size} B; retained after 4 opens {after4} B, after 40 opens {after40} B")
