"""The live status of a running job: its progress line (a browser-side component polling the job's progress file,
or a server-side fragment without static serving), the Cancel button, and the cost of each redraw."""
from __future__ import annotations

import os

import streamlit as st

from pages.session import ROOT, manager
from swapkl.jobs import Job, fmt_s

#: a running job's results are redrawn when the first arrives, when a step of the job ends (all adjacent pairs
#: scored: the verdict) and otherwise at most this often (s); its progress line every POLL_S.  Each redraw costs
#: the computation a script run and a figure render on the same 2 cores (bench/served_default.py: 5 redraws
#: 10 s apart made the default run 1.18x the library's; none at all 1.03x).
MIN_REDRAW_S = float(os.environ.get("SWAPKL_MIN_REDRAW_S", "60.0"))


#: polls of the server-side fallback per job key: {"polls": n, "seconds": s, "redraws": k} (logged once)
VIEW_COST: dict = {}


_LIVE_CSS = """
.swapkl-live .bar { height: 0.5rem; border-radius: 0.25rem; background: var(--st-secondary-background-color, #eee);
                    overflow: hidden; margin: 0.25rem 0; }
.swapkl-live .fill { height: 100%; width: 0; background: var(--st-primary-color, #ff4b4b); }
.swapkl-live .txt { font-size: 0.875rem; margin-bottom: 0.5rem; }
"""


@st.cache_resource(show_spinner=False)
def live_component():
    return st.components.v2.component("swapkl_live_progress", html="", css=_LIVE_CSS,
                                      js=(ROOT / "pages" / "live_progress.js").read_text(encoding="utf-8"))


def browser_polls(job: Job) -> bool:
    """The live line can poll the job's progress file from the browser: the server serves the static folder
    and the job writes into it."""
    return job.progress_path is not None and bool(st.get_option("server.enableStaticServing"))


def has_content(part) -> bool:
    """Whether a job's result / curves / trajectory holds something to draw (a scored pair, a curve point)."""
    if part is None:
        return False
    for attr in ("results", "methods", "pairs"):  # Trajectory, CurvesResult, SwapResult (methods do not count)
        v = getattr(part, attr, None)
        if v is not None and not callable(v):
            return bool(v)
    return True


def progress_view(job: Job, bar: bool = True) -> None:
    """Status: while running the progress bar (``bar``; the live component draws its own) and a Cancel
    button; then one line -- done, cancelled (partial results below) or the error."""
    p = job.progress()
    if job.running:
        if bar:
            st.progress(p.fraction, text=job.progress_line())
        if st.button("Cancel", key=f"cancel_{job.key}", help="stop now; finished pairs stay in the cache"):
            manager().cancel(job.key)
            st.rerun(scope="app")
    elif job.status == "done":
        how = "loaded from the cache" if job.from_snapshot else f"finished in {fmt_s(p.elapsed_s)}"
        st.success(f"Done: {job.request.label()} ({how}).", icon=":material/check_circle:")
    elif job.status == "cancelled":
        st.warning(f"Cancelled: {job.error}. Partial results below.", icon=":material/stop_circle:")
    else:
        st.error(f"Error: {job.error}", icon=":material/error:")
