"""The jobs this browser session looks at: the current job of each kind (:func:`current_job`, :func:`need_result`),
starting one under the server's policy (:func:`start`) and finding an identical one (:func:`find`)."""
from __future__ import annotations

import streamlit as st

from dashboard.session import client_address, manager, session_id
from swapkl.errors import SwapklError
from swapkl.jobs import Job


def current_job(kind: str = "analysis") -> Job | None:
    """The job this session looks at: the one it started, else (a fresh tab or a refresh) the newest job of
    this kind that the server has."""
    mgr = manager()
    job = mgr.get(st.session_state.get(f"job_{kind}"), viewer=session_id())
    if job is None:
        for j in mgr.jobs(viewer=session_id()):  # never another session's opened file
            if j.request.kind == kind:
                job = j
                st.session_state[f"job_{kind}"] = j.key
                break
    return job


def start(request) -> Job | None:
    """Submit ``request`` for this session and its client address; the job manager checks the server's policy
    (demo mode bounds the request, the jobs per session and per address); a refusal is shown as one message and
    gives None."""
    try:
        job = manager().submit(request, owner=session_id(), client=client_address())
    except SwapklError as e:
        st.error(str(e), icon=":material/block:")
        return None
    st.session_state[f"job_{request.kind}"] = job.key
    return job


def find(request) -> Job | None:
    """The job of an identical request (another tab, before a refresh), if the policy allows the request."""
    return manager().find(request)


def need_result(kind: str = "analysis") -> Job | None:
    """The current job if it has something to draw, else an explanation on the page and None."""
    job = current_job(kind)
    if job is None:
        st.info("No computation yet: choose a checkpoint and a contract on the Start page and press Compute.")
        return None
    return job
