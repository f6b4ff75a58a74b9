"""What every dashboard page shares at the server level: the project root, the poll interval, this server's policy,
the browser session's id, its widget state across pages and the one job manager (``st.cache_resource``)."""
from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from swapkl.jobs import JobManager
from swapkl.jobs.policy import Policy

ROOT = Path(__file__).resolve().parent.parent


POLL_S = float(os.environ.get("SWAPKL_POLL_S", "1.0"))  # seconds between progress polls while a job runs
#: seconds after the last browser session waiting for a job closed before the job is cancelled
ABANDON_S = float(os.environ.get("SWAPKL_ABANDON_S", "15"))
#: CPU priority of the job worker relative to the server (Linux nice; 0 = the same): pages and health go first
JOB_NICE = int(os.environ.get("SWAPKL_JOB_NICE", "10"))


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


def client_address() -> str:
    """The address this browser connects from (``st.context.ip_address``; ``"loopback"`` for this machine, where
    Streamlit gives none): a demo server bounds the computations of one address over all its sessions."""
    try:
        return st.context.ip_address or "loopback"
    except Exception:  # outside a script run (a bare import): one shared client
        return "loopback"


def keep_widget_state() -> None:
    """Widget values survive page switches (Streamlit drops the state of widgets that are not drawn)."""
    for k in list(st.session_state.keys()):
        if isinstance(k, str) and k.startswith("w_"):
            st.session_state[k] = st.session_state[k]


def streamlit_session() -> str | None:
    """Streamlit's id of this browser connection (a refresh or a closed tab ends it), or None outside a run."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else None


def connected(session: str) -> bool:
    """Whether the browser connection ``session`` (:func:`streamlit_session`) is still open.  Without a Streamlit
    runtime (an AppTest, a bare script run) nobody can tell, so the session counts as connected: a probe that
    cannot answer must not cancel anybody's job."""
    from streamlit import runtime

    return not runtime.exists() or runtime.get_instance().is_active_session(session)


@st.cache_resource(show_spinner=False)
def manager() -> JobManager:
    """The one job manager of this server process (shared by every session and tab).  It cancels a job when
    every browser session that waited for it has closed (:class:`swapkl.jobs.audience.Audience`) and runs its
    computations at a lower CPU priority than the server (``JOB_NICE``)."""
    progress = ROOT / "static" / "progress" if st.get_option("server.enableStaticServing") else None
    mgr = JobManager(progress_dir=progress, alive=connected, grace_s=ABANDON_S, nice=JOB_NICE, policy=policy())
    if os.environ.get("SWAPKL_STALL_LOG"):  # an operator's diagnostic: stacks of every thread when all stall
        from swapkl.jobs.stalls import watch_stalls

        watch_stalls(os.environ["SWAPKL_STALL_LOG"])
    mgr.warm_up()
    return mgr
