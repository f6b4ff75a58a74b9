"""The sidebar every page shows: the current analysis's contract and status, the session's other running jobs and
the one-click report."""
from __future__ import annotations

import streamlit as st

from dashboard.current import current_job
from dashboard.downloads import report_button
from dashboard.session import manager, session_id
from swapkl.jobs.forms import request_caption


def sidebar() -> None:
    """Always visible: the current job's contract and status, other running jobs, the report."""
    with st.sidebar:
        job = current_job("analysis")
        st.markdown("**Current analysis**")
        if job is None:
            st.caption("none yet — start one on the Start page")
        else:
            st.caption(f"{job.status}: {request_caption(job.request)}")
        others = [j for j in manager().jobs(viewer=session_id()) if j.running and (job is None or j.key != job.key)]
        if others:
            st.markdown("**Also running**")
            for j in others:
                st.caption(f"{j.status}: {j.request.label()}")
        report_button("report_sidebar")
