"""The live view's bookkeeping belongs to the browser session that draws it: what following a job costs (redraws,
polls of the server-side fragment) is counted in ``st.session_state``, once per session, and logged once when the
job ends -- not in a module-level dict every session of the server shares."""
from __future__ import annotations

import logging

from streamlit.testing.v1 import AppTest


def _live_app():
    import streamlit as st

    from dashboard import live_view
    from swapkl.jobs import AnalysisRequest, Job

    job = st.session_state.setdefault("test_job", Job("live-test", AnalysisRequest()))  # queued: it runs
    if st.session_state.get("finish") and job.running:
        job.finish("done")
    live_view.live(job, lambda j: st.write(f"body of {j.key}"), "t", watch=("result",))


def test_view_cost_is_per_session_and_logged_once(cache, caplog):
    from dashboard import live_view

    assert not hasattr(live_view, "VIEW_COST")
    a = AppTest.from_function(_live_app, default_timeout=60).run()
    assert not a.exception, a.exception
    assert [m.value for m in a.markdown] == ["body of live-test"]
    a.run()
    cost = a.session_state["_view_cost"]["live-test"]
    assert cost["redraws"] == 2 and cost["polls"] == 2 and len(cost["at"]) == 2
    b = AppTest.from_function(_live_app, default_timeout=60).run()  # another browser session: its own count
    assert b.session_state["_view_cost"]["live-test"]["redraws"] == 1
    assert a.session_state["_view_cost"]["live-test"]["redraws"] == 2
    with caplog.at_level(logging.INFO, logger="swapkl.jobs"):
        a.session_state["finish"] = True
        a.run()
        a.run()
    lines = [r.getMessage() for r in caplog.records if "live view of job live-test" in r.getMessage()]
    assert lines == ["live view of job live-test (t): 2 server polls, "
                     f"{cost['seconds']:.2f} s drawing progress, 2 result redraws (at {cost['at']} s)"]
    assert a.session_state["_view_cost"]["live-test"]["logged"] is True
