"""What every dashboard page shares at the server level: the project root, the poll interval, this server's policy,
the browser session's id and the one job manager (``st.cache_resource``)."""
from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from swapkl.jobs import JobManager
from swapkl.jobs.policy import Policy

ROOT = Path(__file__).resolve().parent.parent


POLL_S = float(os.environ.get("SWAPKL_POLL_S", "1.0"))  # seconds between progress polls while a job runs


@st.cache_resource(show_spinner=False)
def policy() -> Policy:
    """This server's :class:`~swapkl.jobs.policy.Policy` (demo mode or not), read once at start."""
    return Policy.from_env()


def session_id() -> str:
    """An id of this browser session (owner of the files it opens and of the jobs it submits)."""
    if "_session" not in st.session_state:
        import uuid

        st.session_state["_session"] = uuid.uuid4().hex
    return st.session_state["_session"]


@st.cache_resource(show_spinner=False)
def manager() -> JobManager:
    """The one job manager of this server process (shared by every session and tab)."""
    progress = ROOT / "static" / "progress" if st.get_option("server.enableStaticServing") else None
    mgr = JobManager(progress_dir=progress)
    mgr.warm_up()
    return mgr
