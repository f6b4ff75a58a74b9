"""Removal curves page: ΔPPL % vs budget for replacement- and interchange-guided removal (CI bands), toggleable
baselines, the removed layers per n, KL to base, and exporting a pruned model.  Figures from :mod:`swapkl.views`."""
from __future__ import annotations

import streamlit as st

from dashboard import common, heal_panel, linked, recommend_panel, tasks_panel
from swapkl import views
from swapkl.jobs.exports import curve_export, curve_export_methods

common.app_navigation()  # first: a fresh server's first visit may run this file without app.py
st.title("Removal curves")
job = common.need_result()


def _units_axis(curves, rk, shown) -> None:
    """The curves against the share of non-embedding parameters removed (blocks and sublayers compare there)."""
    afig = common.memo("units_axis", rk + (tuple(shown),), lambda: views.common_axis_figure([curves], methods=shown))
    st.plotly_chart(afig, key="cv_axis")
    st.caption(views.units_axis_caption(curves))


def _repair(curves, rk, shown, cap) -> None:
    """Raw vs bridged ΔPPL % per n with the paired CI (tie when it includes 0), when the curves were repaired."""
    table = common.memo("repair_table", rk + (tuple(shown),), lambda: views.repair_table(curves, shown))
    if not len(table):
        return
    st.subheader("After repair: raw vs bridged")
    st.caption(views.repair_caption(curves) + ". Dashed: bridged; bridged − raw in percentage points of the baseline "
               "perplexity, paired over the same windows; tie when the 95 % CI includes 0.")
    st.dataframe(table, hide_index=True, key="cv_repair")
    common.download_table(table, cap, "repaired-curves", key="dl_repair")


def _figure(job, rk, shown, bands, full, cap):
    """The ΔPPL figure: raw curves, each bridged one dashed over its raw one (a repaired run), the session's healed
    curves dashed on it."""
    fig_key = rk + (tuple(shown), bands, full)
    fig = common.memo("curves", fig_key, lambda: views.with_bridged(views.removal_curves(
        job.curves, methods=shown, bands=bands, full_range=full, caption=cap), job.curves, shown))
    return heal_panel.overlay(fig, job, fig_key)


def body(job) -> None:
    curves = job.curves
    if curves is None or not curves.methods:
        if job.request.kind == "analysis" and not job.request.wants_curves:
            st.info("This analysis has layer budget 0: set a budget on the Start page to get removal curves.")
        else:
            st.info("The curves appear here as each method finishes (guided methods first).")
        return
    cap = views.curves_caption(curves)  # with the repair (form, calibration tokens, ε) when there is one
    st.caption(f"contract: {cap}")
    methods = list(curves.methods)
    c1, c2, c3 = st.columns([3, 1, 1])
    shown = c1.multiselect("Methods shown", methods, default=methods, key="w_cv_methods")
    bands = c2.toggle("CI bands", value=True, key="w_cv_bands")
    full = c3.toggle("Full y range", value=False, key="w_cv_full",
                     help="off: the y axis fits the deterministic curves; seeded baselines above it are marked at "
                          "the top edge with their values")
    rk = common.result_key(job)
    fig = _figure(job, rk, shown, bands, full, cap)
    linked.removal_chart(job, fig, curves, "cv_main")  # a clicked point marks its removed layers (dashboard/linked.py)
    if curves.verdict:
        st.caption(f"Verdict: {curves.verdict['sentence']}")
    if curves.delta_ratio:
        st.caption("ΔPPL ratio interchange / replacement per n: " + ", ".join(
            f"n={r['n']}: {r['ratio']:.3f}" if r["ratio"] is not None else f"n={r['n']}: n/a"
            for r in curves.delta_ratio))

    st.subheader("Removed layers per n")
    table = views.removed_layers_table(curves)

    def mark(r):
        return ["background-color: #fde0dd" if r.get("repl_vs_inter_differ") else ""] * len(r)

    st.dataframe(table.style.apply(mark, axis=1), hide_index=True, key="cv_removed")
    if "repl_vs_inter_differ" in table.columns:
        st.caption("Highlighted: replacement- and interchange-guided removal pick different layers at this n.")
    kfig = common.memo("kl", rk + (tuple(shown),), lambda: views.kl_to_base_figure(curves, methods=shown))
    st.plotly_chart(kfig, key="cv_kl")
    st.caption(f"Baseline perplexity {curves.baseline_ppl:.4g}; ΔPPL in % of it; KL in nats per scored token.")
    for note in curves.notes:
        st.caption(f"note: {note}")
    _units_axis(curves, rk, shown)
    _repair(curves, rk, shown, cap)

    if job.running:
        return
    if curves.unit == "block":
        recommend_panel.section(curves)
    st.markdown("**Downloads** (each carries its contract)")
    a, b, c, d = st.columns(4)
    with a:
        common.download_figure(fig, "removal-curves", key="dl_cv")
    with b:
        common.download_figure(kfig, "kl-to-base", key="dl_kl")
    with c:
        common.download_table(table, cap, "removed-layers", key="dl_removed")
    with d:
        common.download_json(curves.to_json(), "removal-curves", key="dl_cv_json")

    st.subheader("Export a pruned model")
    if curves.unit != "block":
        st.caption(views.units_export_hint(curves))
        return
    det = curve_export_methods(curves)
    if not det:
        st.caption("No method with a deterministic removal set.")
        return
    e1, e2 = st.columns(2)
    m = e1.selectbox("method", det, key="w_exp_method")
    ns = [e["n"] for e in curves.methods[m]]
    n = e2.selectbox("n", ns, key="w_exp_n") if ns else None
    entry, merge = curve_export(curves, m, n)
    if merge:  # a merged model (LaCo): the merged blocks are written, not just the others kept
        common.export_view(job, entry["removed"], f"Export merged model ({entry['merge']})", key="export", merge=merge)
    else:
        common.export_view(job, entry["removed"], f"Export pruned model (remove {entry['removed']})", key="export",
                           provenance={"chosen_by": f"{m}, n={n} (removal curves)", "measured_on": cap})


common.live(job, body, "curves", watch=("curves",))
if job is not None:
    tasks_panel.section(job)
    heal_panel.section(job)
