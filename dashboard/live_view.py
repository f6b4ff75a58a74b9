"""The live status of a running job: :func:`live` draws a job's status and its page's body and keeps them current
-- its progress line (a browser-side component polling the job's progress file, or a server-side fragment without
static serving), the Cancel button -- and logs what following the job cost this session."""
from __future__ import annotations

import logging
import os
import time

import streamlit as st

from dashboard.session import POLL_S, ROOT, manager, streamlit_session
from swapkl.jobs import Job, fmt_s
from swapkl.jobs.contents import has_content

#: a running job's results are redrawn when the first arrives, when a step of the job ends (all adjacent pairs
#: scored: the verdict) and otherwise at most this often (s); its progress line every POLL_S.  Each redraw costs
#: the computation a script run and a figure render on the same 2 cores (benchmarks/served_default.py: 5 redraws
#: 10 s apart made the default run 1.18x the library's; none at all 1.03x).
MIN_REDRAW_S = float(os.environ.get("SWAPKL_MIN_REDRAW_S", "60.0"))


def view_cost() -> dict:
    """What following each job cost this browser session (``st.session_state``), per job key: ``{"polls": server
    polls of the fallback fragment, "seconds": spent drawing them, "redraws": script runs while it ran, "at": their
    times (s since the job started), "logged": whether the line was written}``; logged once, when the job ends
    (``benchmarks/served_default.py`` reads that line)."""
    return st.session_state.setdefault("_view_cost", {})


_LIVE_CSS = """
.swapkl-live .bar { height: 0.5rem; border-radius: 0.25rem; background: var(--st-secondary-background-color, #eee);
                    overflow: hidden; margin: 0.25rem 0; }
.swapkl-live .fill { height: 100%; width: 0; background: var(--st-primary-color, #ff4b4b); }
.swapkl-live .txt { font-size: 0.875rem; margin-bottom: 0.5rem; }
"""


@st.cache_resource(show_spinner=False)
def live_component():
    return st.components.v2.component("swapkl_live_progress", html="", css=_LIVE_CSS,
                                      js=(ROOT / "dashboard" / "live_progress.js").read_text(encoding="utf-8"))


def browser_polls(job: Job) -> bool:
    """The live line can poll the job's progress file from the browser: the server serves the static folder
    and the job writes into it."""
    return job.progress_path is not None and bool(st.get_option("server.enableStaticServing"))


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


def _log_cost(job: Job, key: str) -> None:
    c = view_cost().get(job.key)
    if c is not None and not c.get("logged"):
        c["logged"] = True
        logging.getLogger("swapkl.jobs").info("live view of job %s (%s): %d server polls, %.2f s drawing progress, "
                                              "%d result redraws (at %s s)", job.key, key, c["polls"], c["seconds"],
                                              c["redraws"], c.get("at"))


def live(job: Job | None, body, key: str, watch: tuple = ("result", "curves", "trajectory")) -> None:
    """Draw the job's status and ``body(job)``; while the job runs, keep them current at no cost to the
    computation, which shares the CPU with this server and the browser.

    The progress line is a small browser-side component that polls the job's progress file
    (``static/progress/<key>.json``, :meth:`swapkl.jobs.Job.progress_dict`) every ``POLL_S`` seconds -- no
    script run at all.  When the job has something new for this page (one of the parts in ``watch`` changed,
    the first result at once, when a step of the job ends, else at most every ``MIN_REDRAW_S`` seconds) or ends,
    the component triggers one rerun, which draws ``body`` anew (its figures and statistics are memoised on the
    content, :func:`dashboard.figures.memo`).  Without static serving, a fragment polls the server instead (same
    redraw rule)."""
    if job is None:
        return
    if job.running and (sid := streamlit_session()) is not None:
        manager().watch(job.key, sid)  # this browser waits for it (a job nobody waits for is cancelled)
    if not job.running:
        _log_cost(job, key)
        progress_view(job)
        body(job)
        return
    seen = sum(job.updates[w] for w in watch)
    # nothing of the watched parts drawn yet: the first that arrives is drawn at once
    empty = not any(has_content(getattr(job, w, None)) for w in watch)
    c = view_cost().setdefault(job.key, {"polls": 0, "seconds": 0.0, "redraws": 0, "at": []})
    c["redraws"] += 1
    c["at"].append(round(time.time() - (job.started or time.time()), 1))
    if browser_polls(job):
        live_component()(data={"url": f"app/static/progress/{job.progress_path.name}", "watch": list(watch),
                               "drawn": seen, "empty": empty, "progress": job.progress_dict(),
                               "poll_ms": int(POLL_S * 1000), "min_redraw_ms": int(MIN_REDRAW_S * 1000)},
                         key=f"live_{key}_{job.key}", on_redraw_change=lambda: None)
        progress_view(job, bar=False)
        body(job)
        return
    _poll_fragment(job, key, watch, seen, empty, c)
    body(job)


def _poll_fragment(job: Job, key: str, watch: tuple, seen: int, empty: bool, c: dict) -> None:
    """Without static serving: a fragment redraws the progress line every ``POLL_S`` seconds and reruns the page
    by :func:`live`'s rule."""
    state = st.session_state.setdefault("_live", {})
    state[key] = (seen, time.monotonic(), job.progress().step)

    @st.fragment(run_every=POLL_S)
    def _poll():
        t0 = time.perf_counter()
        progress_view(job)
        c["polls"] += 1
        c["seconds"] += time.perf_counter() - t0
        last_v, last_t, last_step = state.get(key, (seen, 0.0, None))
        if not job.running:
            st.rerun(scope="app")
        elif sum(job.updates[w] for w in watch) != last_v and (
                empty or job.progress().step != last_step or time.monotonic() - last_t >= MIN_REDRAW_S):
            st.rerun(scope="app")

    _poll()
