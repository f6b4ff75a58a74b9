"""Heatmaps page: both protocols on one colour scale, the directed replacement matrix, the gap, a pair
drill-down and the top-k pairs per protocol; after a bridge repair the bridged matrix beside both protocols.  Figures come from :mod:`swapkl.views`."""
from __future__ import annotations

import streamlit as st

from dashboard import common, linked
from swapkl import views

common.app_navigation()  # first: a fresh server's first visit may run this file without app.py
st.title("Heatmaps")
job = common.need_result()


def bridged_heatmap(job, cap: str, rk: tuple) -> None:
    """After a bridge repair: the bridged matrix beside both protocols on one colour scale, which pair each ranks
    best and which protocol's best pair the bridge favours, and the contract with the bridge's settings."""
    res, bridged = job.result, job.bridged
    if bridged is None:
        return
    st.subheader("After the bridge")
    bfig = common.memo("bridged_heatmaps", rk + (job.updates["bridged"],), lambda: views.bridged_heatmaps(res, bridged))
    st.plotly_chart(bfig, key="hm_bridged")
    st.caption(views.bridge_statement(res, bridged))
    st.caption(f"contract: {cap} · {views.bridge_caption(bridged)}")


def pair_captions(job, table, i: int, j: int) -> None:
    """The pair's numbers (nats), and after a bridge repair its span's bridged and unbridged (removed) cost."""
    row = table.set_index(["i", "j"]).loc[(i, j)]
    st.caption(f"d_repl {row['d_repl']:.4g} nats (R[{i}][{j}] {row['R_ij']:.4g}, R[{j}][{i}] {row['R_ji']:.4g}) · "
               f"d_inter {row['d_inter']:.4g} nats · gap {row['gap']:.4g} nats · KL ratio {row['kl_ratio']:.3f}")
    costs = views.span_costs(job.bridged, i, j) if job.bridged is not None else None
    if costs is not None:
        st.caption(f"span {i}..{j - 1}: bridged {costs[0]:.4g} nats · unbridged (removed) {costs[1]:.4g} nats")


def body(job) -> None:
    res = job.result
    if res is None or not res.pairs:
        st.info("No pair has finished yet; the heatmaps fill in as pairs arrive (adjacent pairs first).")
        return
    cap = views.contract_caption(res)
    st.caption(f"contract: {cap}")
    if views.is_adjacent_only(res):
        st.info("Only adjacent pairs were scored, so the heatmaps are a thin diagonal: the Start page leads with "
                "their depth profile (below). Choose the pair set gap:K or all for full heatmaps.")
    c1, c2 = st.columns([1, 3])
    scale = c1.radio("Colour scale", ("linear", "log"), key="w_hm_scale", horizontal=True)
    directed = c2.toggle("Directed replacement matrix R[i][j] (slot i ← block j)", key="w_hm_directed")
    rk = common.result_key(job)
    fig = common.memo("heatmaps", rk + (scale, directed), lambda: views.heatmaps(res, scale=scale, directed=directed))
    linked.heatmap_marks(job)
    events = {"hm_main": linked.chart(job, fig, "hm_main", rk + (scale, directed), width="stretch")}
    st.caption("Blank cells were not computed (not zero). Hover shows d_repl, d_inter and the gap with 95 % "
               "bootstrap CIs over prompts.")
    gfig = common.memo("gap", rk, lambda: views.gap_heatmap(res))
    events["hm_gap"] = linked.chart(job, gfig, "hm_gap", rk)
    events["hm_depth"] = linked.depth_chart(job, "hm_depth")  # adjacent pairs only: the depth profile, clickable
    st.caption("Click a cell (or a point of the depth profile) to open its drill-down below.")
    bridged_heatmap(job, cap, rk)

    st.subheader("Pair drill-down")
    pairs = list(res.pairs)
    linked.open_pair(events, pairs)  # a new click on a cell or a depth-profile point picks the pair below
    firsts = sorted({i for i, _ in pairs})
    d1, d2 = st.columns(2)
    q = st.query_params.get("pair", "")
    if "w_pair_i" not in st.session_state and "-" in q:  # a shared link: ?pair=i-j
        try:
            qi, qj = (int(x) for x in q.split("-", 1))
            st.session_state["w_pair_i"], st.session_state["w_pair_j"] = qi, qj
        except ValueError:
            pass
    if st.session_state.get("w_pair_i") not in firsts:
        st.session_state["w_pair_i"] = firsts[0]
    i = d1.selectbox("layer i", firsts, key="w_pair_i")
    seconds = sorted(j for a, j in pairs if a == i)
    if st.session_state.get("w_pair_j") not in seconds:
        st.session_state["w_pair_j"] = seconds[0]
    j = d2.selectbox("layer j", seconds, key="w_pair_j")
    if q != f"{i}-{j}":
        st.query_params["pair"] = f"{i}-{j}"
    pfig = common.memo("pair", rk + (i, j), lambda: views.pair_distribution(res, i, j))
    st.plotly_chart(pfig, key="hm_pair")
    table = common.memo("pair_table", rk, res.pair_table)
    pair_captions(job, table, i, j)

    st.subheader("Most redundant pairs per protocol")
    k = st.slider("top k", 1, max(1, len(pairs)), min(10, len(pairs)), key="w_topk")
    top = views.top_pairs_table(res, k)

    def mark(r):
        return ["background-color: #fde0dd" if r["disagree"] else ""] * len(r)

    st.dataframe(top.style.apply(mark, axis=1).format({"d_repl": "{:.4g}", "d_inter": "{:.4g}"}),
                 hide_index=True, key="top_table")
    st.caption("Highlighted rows: the two protocols' top-k lists disagree at this rank (the pair is missing from "
               "the other protocol's top k).")
    if not job.running:
        st.markdown("**Downloads** (each carries its contract)")
        a, b, c, d = st.columns(4)
        with a:
            common.download_figure(fig, "heatmaps", key="dl_hm")
        with b:
            common.download_figure(gfig, "gap-heatmap", key="dl_gap")
        with c:
            common.download_table(table, cap, "pair-table", key="dl_pairs")
        with d:
            common.download_json(common.result_json(job, public=common.policy().demo), "swapkl-result",
                                 key="dl_json_hm")
        e, f = st.columns(2)
        with e:
            common.download_table(top, cap, f"top-{k}-pairs", key="dl_top")
        with f:
            common.download_figure(pfig, f"pair-{i}-{j}-per-prompt", key="dl_pairfig")


common.live(job, body, "heatmaps", watch=("result", "bridged"))
