"""Figures drawn once per content: :func:`memo` keeps what a page builds from a job's parts in this session, under
a key of their content (:func:`result_key`, :func:`swapkl.jobs.contents.content_key`), so a rerun that finds nothing
new redraws nothing; and the figure the start page leads with (:func:`lead_figure`)."""
from __future__ import annotations

import streamlit as st

from swapkl import views
from swapkl.jobs import Job
from swapkl.jobs.contents import content_key
from swapkl.views import links

#: figures and tables kept per session; past this many the memo starts afresh
MEMO_SIZE = 64


def memo(name: str, key: tuple, fn):
    """``fn()`` memoised per session under ``(name, *key)`` (figures are rebuilt only when their input changes,
    not on every one-second poll).  ``key`` names content (:func:`result_key`, values of widgets), never ``id()``
    of an object: a freed object's id is reused."""
    store = st.session_state.setdefault("_memo", {})
    k = (name, *key)
    if k not in store:
        if len(store) > MEMO_SIZE:
            store.clear()
        store[k] = fn()
    return store[k]


def result_key(job: Job) -> tuple:
    """What identifies the drawable state of an analysis job: the content of its score result and its curves so
    far (:func:`swapkl.jobs.contents.content_key`)."""
    return (content_key(job.result, job.curves),)


def lead_figure(job: Job, verdict: dict | None, key: str, marks: list | None = None):
    """The figure a result leads with: the depth profile (both protocols against layer depth, CI bands,
    thresholds, best pairs) when only adjacent pairs exist -- their heatmaps would be blank but for a thin
    diagonal -- else the two heatmaps on one colour scale.  ``marks``: layers drawn marked (a removal set clicked
    on the Removal curves page, :func:`swapkl.views.links.mark_layers`).  Returns the figure, unmarked (for
    downloads)."""
    res = job.result
    rk = result_key(job)

    def shown(fig, name):
        if not marks:
            return fig
        return memo("lead_marks", rk + (name, tuple(marks)), lambda: links.mark_layers(fig, marks))
    if views.is_adjacent_only(res):
        directed = st.toggle("Show the two directed replacement means R[i][i+1], R[i+1][i]", key=f"w_{key}_directed")
        fig = memo("depth", rk + (directed, (verdict or {}).get("regime")),
                   lambda: views.depth_profile(res, verdict=verdict, directed=directed))
        st.plotly_chart(shown(fig, ("depth", directed)), key=f"{key}_depth", width="stretch")
        st.caption("Adjacent pairs only (the heatmaps would be a thin diagonal): choose the pair set gap:K or all "
                   "for heatmaps. Bands: 95 % bootstrap CIs over prompts; stars: each protocol's best pair.")
    else:
        fig = memo("heatmaps", rk + ("linear", False), lambda: views.heatmaps(res))
        st.plotly_chart(shown(fig, ("heatmaps",)), key=f"{key}_heatmaps", width="stretch")
    return fig
