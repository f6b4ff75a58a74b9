"""Training trajectory page: both protocols on every checkpoint of one model (hub revisions or local
checkpoint folders), the gap distribution / KL ratio / Pearson r against training step and the per-pair gap
against depth at the last checkpoint.  Computation: :func:`swapkl.trajectory.compute.compute_trajectory` (each
checkpoint cached on its own); figures: :func:`swapkl.views.trajectory.trajectory_figures`."""
from __future__ import annotations

import streamlit as st

from dashboard import common
from swapkl import views
from swapkl.contract import Contract
from swapkl.errors import SwapklError
from swapkl.jobs import TrajectoryRequest
from swapkl.jobs.defaults import default_trajectory_list
from swapkl.jobs.forms import trajectory_request

common.app_navigation()  # first: a fresh server's first visit may run this file without app.py
st.title("Training trajectory")
st.caption("How the replacement / interchange gap evolves over training. One checkpoint list per model: hub "
           "revisions (`EleutherAI/pythia-160m@step0, @step1000, @step143000`) or a folder of checkpoints "
           "(a trainer's `checkpoint-*`, or the demo trajectory from `python -m swapkl demo-trajectory`).")

st.session_state.setdefault("w_tr_list", default_trajectory_list())
st.session_state.setdefault("w_tr_k", 1)
st.session_state.setdefault("w_tr_prompts", 8)
st.session_state.setdefault("w_tr_tokens", 32)
text = st.text_area("Checkpoints (in training order)", key="w_tr_list", height=80)
c1, c2, c3, c4 = st.columns(4)
k = c1.number_input("pairs |i − j| ≤ k (1 = adjacent)", 1, 64, key="w_tr_k", step=1)
prompts = c2.number_input("Prompts P", 1, 4096, key="w_tr_prompts", step=1)
tokens = c3.number_input("Tokens T", 2, 8192, key="w_tr_tokens", step=8)
device = c4.selectbox("device", ("auto", "cpu", "cuda"), key="w_tr_device")
request, err = None, None
try:
    request = trajectory_request(text, k, prompts, tokens, device)
    common.policy().check_request(request)  # a demo server's bounds, said before the button is pressed
except SwapklError as e:
    request = None
    err = str(e)
if err:
    st.error(err)
else:
    st.code(common.request_caption(request), language=None, wrap_lines=True)


def _train_demo() -> None:
    from swapkl.store import cache_root

    demo = str(cache_root() / "demo-trajectory")
    st.session_state["w_tr_list"] = demo
    c = request.contract if request is not None else Contract(prompts=8, tokens=32)
    common.start(TrajectoryRequest(demo, c, train_demo=True))


job = None
b1, b2 = st.columns([1, 3])
b2.button("Train the demo trajectory and score it", key="demo_traj", on_click=_train_demo,
          help="python -m swapkl demo-trajectory: a small GPT-NeoX trained on the CPU (about 3 min), checkpoints "
               "saved in cache/demo-trajectory/ (reused once trained)")
if b1.button("Compute trajectory", type="primary", disabled=request is None, key="compute_traj"):
    job = common.start(request)
elif request is not None:
    job = common.find(request)
if job is None:
    job = common.current_job("trajectory")


def body(job) -> None:
    traj = job.trajectory
    if traj is None or not traj.results:
        if job.running:
            st.info("Statistics appear after the first checkpoint finishes.")
        return
    stats = traj.summary()
    depth = traj.depth()
    tj = traj.to_dict()
    cap = views.contract_caption(traj)
    st.caption(f"contract: {cap}")
    figs = views.trajectory_figures(stats, depth, caption=cap)
    a, b = st.columns(2)
    a.plotly_chart(figs["gap"], key="tr_gap")
    b.plotly_chart(figs["kl_ratio"], key="tr_ratio")
    a2, b2 = st.columns(2)
    a2.plotly_chart(figs["pearson"], key="tr_pearson")
    if "depth" in figs:
        b2.plotly_chart(figs["depth"], key="tr_depth")
    st.dataframe(stats, hide_index=True, key="tr_stats")
    if job.running:
        return
    st.markdown("**Downloads** (each carries its contract)")
    cols = st.columns(len(figs) + 2)
    for col, (name, fig) in zip(cols, figs.items()):
        with col:
            common.download_figure(fig, f"trajectory-{name}", key=f"dl_tr_{name}")
    with cols[-2]:
        common.download_table(stats, cap, "trajectory-stats", key="dl_tr_csv")
    with cols[-1]:
        common.download_json(tj, "trajectory", key="dl_tr_json")


if job is not None:
    st.divider()
    common.live(job, body, "trajectory", watch=("trajectory",))
else:
    st.info("Press **Compute trajectory**; checkpoints already scored under this contract come from the cache.")
