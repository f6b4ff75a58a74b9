"""Linked views on the analysis pages: a click on a heatmap cell or a depth-profile point opens the pair drill-down
(:func:`open_pair`, the Heatmaps page's widgets ``w_pair_i`` / ``w_pair_j``), and a click on a removal curve marks
that set's removed layers on the depth profile and the heatmaps (:func:`pick_removal` keeps it in the session,
:func:`chart` draws a figure clickable with the marks, :func:`removal_marks` names the set with a 'clear' control).
What a click means and the marks themselves: :mod:`swapkl.views.links`."""
from __future__ import annotations

import streamlit as st

from dashboard.figures import memo, result_key
from swapkl import views
from swapkl.views import links

#: session_state key of the marked removal set: {"job": job key, "method", "n", "removed", "delta_pct", ...}
MARK = "linked_removal"


def marked(job) -> dict | None:
    """The removal set marked for ``job`` in this session, or None."""
    sel = st.session_state.get(MARK)
    return sel if isinstance(sel, dict) and job is not None and sel.get("job") == job.key else None


def _clear() -> None:
    st.session_state[MARK] = None


def chart(job, fig, key: str, memo_key: tuple, **kw):
    """Draw ``fig`` (memoised under ``memo_key``) with its heatmap cells clickable and the layers of the session's
    marked removal set shaded; returns the chart's selection event."""
    import plotly.graph_objects as go

    shown = memo("linked_click", (key, *memo_key), lambda: links.add_cell_markers(go.Figure(fig)))
    sel = marked(job)
    if sel is not None:
        base = shown
        shown = memo("linked_marks", (key, *memo_key, tuple(sel["removed"])),
                     lambda: links.mark_layers(base, sel["removed"]))
    return st.plotly_chart(shown, key=key, on_select="rerun", selection_mode="points", **kw)


def open_pair(events: dict, pairs) -> None:
    """Point the drill-down widgets at the pair of a NEW click among ``events`` ({chart key: selection event}); a
    selection already acted on is left alone, so the pickers stay free to change.  Call before the pickers are drawn."""
    seen = st.session_state.setdefault("_linked_pairs", {})
    new = None
    for key, ev in events.items():
        p = links.selected_pair(ev, None, pairs)
        if p != seen.get(key):
            seen[key] = p
            new = p or new
    if new is not None:
        st.session_state["w_pair_i"], st.session_state["w_pair_j"] = new


def pick_removal(job, fig, curves, event) -> None:
    """Keep the removal set a NEW click on the removal-curves figure ``fig`` names as the session's marked set."""
    sig = repr((job.key, (event or {}).get("selection", {}).get("points") if isinstance(event, dict) else None))
    if st.session_state.get("_linked_curve_seen") == sig:
        return
    st.session_state["_linked_curve_seen"] = sig
    sel = links.curve_point(fig, curves, event)
    if sel is not None:
        st.session_state[MARK] = {"job": job.key, **sel}


def depth_chart(job, key: str):
    """The depth profile of ``job``'s result drawn clickable (and marked) when only adjacent pairs were scored;
    returns its selection event, or None when there is none to draw."""
    res = job.result
    if res is None or not views.is_adjacent_only(res):
        return None
    rk = result_key(job)
    fig = memo("depth", rk + (False, None), lambda: views.depth_profile(res))
    return chart(job, fig, key, rk, width="stretch")


def removal_chart(job, fig, curves, key: str) -> None:
    """The removal-curves figure ``fig`` drawn clickable: a clicked point's removal set is kept
    (:func:`pick_removal`) and shown marked (:func:`removal_marks`)."""
    event = st.plotly_chart(fig, key=key, on_select="rerun", selection_mode="points")
    pick_removal(job, fig, curves, event)
    removal_marks(job)


def removal_marks(job) -> None:
    """The marked removal set in words, a 'clear' control and the depth profile (adjacent pairs only) or the
    heatmaps with its layers shaded; nothing when no set is marked."""
    sel = marked(job)
    res = job.result
    if sel is None:
        st.caption("Click a point of a removal curve to mark its removed layers on the depth profile and heatmaps.")
        return
    st.caption(links.removal_sentence(sel) + " (also on the Heatmaps page)")
    st.button("Clear the marked layers", key="linked_clear", on_click=_clear)
    if res is None or not res.pairs:
        return
    if depth_chart(job, "linked_lead") is None:
        rk = result_key(job)
        fig = memo("heatmaps", rk + ("linear", False), lambda: views.heatmaps(res))
        chart(job, fig, "linked_lead", rk, width="stretch")


def heatmap_marks(job) -> None:
    """On the Heatmaps and Start pages: the marked removal set in words and a 'clear' control (the figures carry the
    marks)."""
    sel = marked(job)
    if sel is not None:
        st.caption(links.removal_sentence(sel) + " (chosen on the Removal curves page)")
        st.button("Clear the marked layers", key="linked_clear_hm", on_click=_clear)
