"""Compare page: two finished analyses side by side -- per protocol A, B and B − A (heatmaps, or depth profiles for
adjacent pairs), the rank agreement of their swap-KL with CIs and each one's regime verdict, and the transfer table
of an uploaded ``swapkl compare --json``.  What is comparable and the comparison itself: :mod:`swapkl.jobs.comparisons`
(docs/compare.md); figures and tables: :mod:`swapkl.compare.figures`."""
from __future__ import annotations

import streamlit as st

from dashboard import common
from swapkl.compare.figures import agreement_rows, side_by_side, transfer_rows
from swapkl.errors import SwapklError
from swapkl.jobs import comparisons as C
from swapkl.jobs.contents import content_key
from swapkl.views.captions import contract_caption
from swapkl.views.links import selected_pair
from swapkl.views.scores import pair_distribution

common.app_navigation()  # first: a fresh server's first visit may run this file without app.py
st.title("Compare")
st.caption("Does a redundancy ranking computed on one checkpoint hold on another? Pick two finished analyses (computed "
           "here, or opened from score files or bundles on the Start page or below), scored under the same contract.")

with st.expander("Open score files or bundles to compare"):
    ups = st.file_uploader("score JSON or bundle", type=["json"], accept_multiple_files=True, key="cmp_open")
    if st.button("Open", key="cmp_open_button", disabled=not ups):
        for up in ups:
            try:
                (data,) = common.checked_upload(up)
                common.manager().open_files(data, owner=common.session_id())
            except SwapklError as e:
                st.error(f"{up.name}: {e}")

jobs = C.comparable(common.manager().jobs(viewer=common.session_id()))
if len(jobs) < 2:
    st.info("Two finished analyses are needed: compute them on the Start page, or open score files above.")
    st.stop()
labels = [C.choice_label(j) for j in jobs]
q = st.query_params
c1, c2 = st.columns(2)
ia = c1.selectbox("A (scored on)", range(len(jobs)), index=C.pick(jobs, q.get("a"), 1), format_func=labels.__getitem__,
                  key="cmp_a")
ib = c2.selectbox("B (pruned)", range(len(jobs)), index=C.pick(jobs, q.get("b"), 0), format_func=labels.__getitem__,
                  key="cmp_b")
job_a, job_b = jobs[ia], jobs[ib]
for name, value in C.query(job_a, job_b).items():  # the address bar holds the comparison (and its pair below)
    if st.query_params.get(name) != value:
        st.query_params[name] = value
tfile = st.file_uploader("transfer table: a 'swapkl compare A B --budget N --json' file of these two (optional)",
                         type=["json"], key="cmp_transfer")
tres = None
if tfile is not None:
    try:  # the size first, then parsed once per content (not on every rerun)
        tres = common.parsed_upload(tfile, C.transfer_file, "comparison file")
    except SwapklError as e:
        st.error(f"{tfile.name}: {e}")
key = (content_key(job_a.result, job_b.result), content_key(tres))
try:
    cmp = common.memo("comparison", key, lambda: C.compare_jobs(job_a, job_b, tres))
except SwapklError as e:
    st.error(str(e))
    st.stop()
cap = contract_caption(cmp)
for note in cmp.notes:
    st.caption(note)

st.subheader("Rank agreement of the two models' swap-KL")
st.dataframe(agreement_rows(cmp), hide_index=True, key="cmp_agreement")
st.caption(f"contract: {cap}; Spearman ρ and Kendall τ-b over the pairs both scored, 95 % bootstrap CIs over prompts "
           f"({'paired: same prompts' if cmp.agreement['shared_prompts'] else 'unpaired: different prompts'})")
for side in ("a", "b"):
    v = cmp.agreement["verdicts"][side]
    st.caption(f"verdict {side.upper()}: {v.get('sentence')}")

events = {}
for protocol in ("replacement", "interchange"):
    fig = common.memo("cmp_fig", (*key, protocol), lambda p=protocol: side_by_side(job_a.result, job_b.result, p, cap))
    events[protocol] = st.plotly_chart(fig, key=f"cmp_fig_{protocol}", on_select="rerun", selection_mode="points")
st.caption("Click a cell (or a point of a depth profile) to open its drill-down below.")
both = cmp.agreement["replacement"]["pairs"]
pair = None
for protocol in ("replacement", "interchange"):
    pair = pair or selected_pair(events[protocol], None, both)
pair = pair or selected_pair(None, st.query_params.get("pair"), both)
if pair is not None:
    i, j = pair
    st.query_params["pair"] = f"{i}-{j}"
    st.subheader(f"Pair ({i}, {j}): per-prompt swap-KL of A and B")
    d1, d2 = st.columns(2)
    for col, side, res in ((d1, "A", job_a.result), (d2, "B", job_b.result)):
        pfig = common.memo("cmp_pair", (*key, side, i, j), lambda r=res: pair_distribution(r, i, j))
        col.plotly_chart(pfig, key=f"cmp_pair_{side}")

st.subheader("Transfer of the decision: A's set removed from B")


def transfer_body(c) -> None:
    if c is None or not c.transfer:
        return
    st.dataframe(transfer_rows(c), hide_index=True, key="cmp_transfer_table")
    t = c.transfer
    st.caption(f"contract: {cap}; held-out ΔPPL % on B (baseline PPL {t['baseline_ppl']:.4g}, {t['n_windows']} "
               "windows); A − B with a paired bootstrap 95 % CI over B's windows: tie when it includes 0")


if cmp.transfer:
    transfer_body(cmp)
else:
    budget = st.number_input("budget n (transfer table for 1..n)", 1, 16, 3, key="cmp_budget")
    try:
        treq = C.transfer_request(job_a, job_b, int(budget))
    except SwapklError as e:
        treq = None
        st.caption(f"{e}.")
    if treq is not None:
        st.code(treq.label(), language=None, wrap_lines=True)
        tjob = common.start(treq) if st.button("Compute the transfer table", key="cmp_transfer_go") \
            else common.find(treq)
        common.live(tjob, lambda j: transfer_body(j.comparison), "cmp_transfer_live", watch=("comparison",))
common.download_json(cmp.to_json(), "swapkl-compare", key="cmp_dl")
