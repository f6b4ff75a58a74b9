"""Evidence page: how far to trust a layer ranking on this checkpoint -- the measured cost of removing each layer
alone (held-out ΔPPL with CIs), every signal's rank agreement with it (heatmap, CIs on hover), and the stability of
the chosen sets under a bootstrap of the scoring prompts; with a repair part (``swapkl evidence --repair bridge``),
which signal predicts the cost after a bridge.  An evidence JSON can be opened and is shown the same way.
Computation: :func:`swapkl.evidence.run.compute_evidence` through the job system; figures:
:mod:`swapkl.evidence.figures` (docs/evidence.md)."""
from __future__ import annotations

import streamlit as st

from dashboard import common, tasks_panel
from swapkl.errors import SwapklError
from swapkl.jobs.contents import content_key
from swapkl.jobs.exports import evidence_export
from swapkl.jobs.forms import evidence_request

common.app_navigation()  # first: a fresh server's first visit may run this file without app.py
st.title("Evidence")
st.caption("Which layer signal to believe on this checkpoint, and how firmly: the cost of removing each layer "
           "alone on held-out text (disjoint from the scoring prompts and the calibration text), how well each "
           "signal ranks it, and how often each layer is chosen when the scoring prompts are resampled.")

analysis = common.current_job("analysis")
base_req = analysis.request if analysis is not None else None
st.session_state.setdefault("w_ev_model", base_req.model if base_req is not None else "default")
st.session_state.setdefault("w_ev_budget", 4)
st.session_state.setdefault("w_ev_boot", 200)
pol = common.policy()
c1, c2, c3 = st.columns([3, 1, 1])
if pol.demo:  # a visitor picks from the allow-list; nothing typed reaches the loader
    offered = list(pol.models)
    if st.session_state["w_ev_model"] not in offered:
        st.session_state["w_ev_model"] = offered[0]
    model = c1.selectbox("Checkpoint", offered, key="w_ev_model")
else:
    model = c1.text_input("Checkpoint", key="w_ev_model")
budget = c2.number_input("budget n (stability for 1..n)", 1, pol.max_budget if pol.demo else 64, key="w_ev_budget",
                         step=1)
boot = c3.number_input("bootstrap B", 10, pol.max_evidence_boot if pol.demo else 2000, key="w_ev_boot", step=10)
repair, bridge = common.repair_widgets(
    "w_ev", "After repair", help="linear bridge: also remove each block with a least-squares linear map fitted on "
                                 "calibration text in its place (docs/repair.md), and rank the signals against that "
                                 "bridged cost too (docs/evidence.md, \"After repair\")")
with st.expander("Task ground truth (lm-eval): each block's accuracy loss beside its perplexity cost"):
    with_tasks = st.checkbox("Also measure task accuracy with each block removed (one lm-eval run per block)",
                             key="w_ev_with_tasks")
    tasks, limit, shots, include = tasks_panel.task_widgets(pol, "w_ev_tasks") if with_tasks else ((), None, None, None)
request, err = None, None
try:
    request = evidence_request(model, budget, boot, base_req, repair, bridge, tasks, limit, shots, include)
    pol.check_request(request)
except SwapklError as e:
    request, err = None, str(e)
if err:
    st.error(err)
else:
    st.code(request.label(), language=None, wrap_lines=True)

job = None
if st.button("Compute evidence", type="primary", disabled=request is None, key="compute_evidence"):
    job = common.start(request)
elif request is not None:
    job = common.find(request)
if job is None:
    job = common.current_job("evidence")


def results(d: dict, ek: tuple, suffix: str = "") -> str:
    """Draw an evidence dict (headline, figures, sets, after repair, notes); returns its contract caption.
    ``suffix`` keeps the element keys of an opened file apart from the job's."""
    from swapkl.evidence.figures import evidence_figures
    from swapkl.evidence.report import caption

    cap = caption(d)
    st.markdown(f"**{d['headline']}**")
    st.caption(f"contract: {cap}")
    figs = common.memo("evidence_figs", ek, lambda: evidence_figures(d))
    st.plotly_chart(figs["agreement"], key="ev_agreement" + suffix)
    st.plotly_chart(figs["ground_truth"], key="ev_ground_truth" + suffix)
    if "task_truth" in figs:  # evidence --tasks: the second ground truth
        task_truth(d, figs["task_truth"], suffix)
    st.plotly_chart(figs["stability"], key="ev_stability" + suffix)
    if (d.get("definitions") or {}).get("statement"):  # which per-layer definition predicts the removal cost better
        st.markdown(f"**Per-layer definitions.** {d['definitions']['statement']}")
    unstable = [f"{s} n={n}" for s, per in d["stability"].items() for n, v in per.items() if v["unstable"]]
    if unstable:
        st.warning("unstable (P(same set) < 0.8): " + ", ".join(unstable))
    r = d.get("region")
    if r:
        st.caption(f"region effect: ground truth on words {r['region_1'].get('words')} vs "
                   f"{r['region_2'].get('words')}: ρ = {r['spearman_ppl']:.2f}")
    sa = d.get("set_agreement")
    if sa:  # the set-level agreement: every method's sets, each signal's set score against their measured cost
        import pandas as pd

        from swapkl.evidence.section import set_rows

        st.markdown(f"**Sets.** {sa['headline']}")
        st.dataframe(pd.DataFrame(set_rows(d)), hide_index=True)
        for n in sa.get("notes", []):
            st.caption(f"note (sets): {n}")
    if d.get("repair"):
        after_repair(d, ek, suffix)
    for n in d.get("notes", []):
        st.caption(f"note: {n}")
    return cap


def task_truth(d: dict, fig, suffix: str = "") -> None:
    """The task ground truth: its headline, the two ground truths' agreement, the accuracy loss per block (figure and
    table with CIs) and every signal's ρ with it beside its ρ with ΔPPL."""
    import pandas as pd

    from swapkl.evidence.section import agreement_rows, task_truth_rows, truths_statement

    st.subheader("Task ground truth")
    st.markdown(f"**{d.get('headline_acc', '')}**")
    st.markdown(truths_statement(d))
    st.plotly_chart(fig, key="ev_task_truth" + suffix)
    st.dataframe(pd.DataFrame(task_truth_rows(d)), hide_index=True, key="ev_task_rows" + suffix)
    st.dataframe(pd.DataFrame(agreement_rows(d)), hide_index=True, key="ev_task_agreement" + suffix)


def after_repair(d: dict, ek: tuple, suffix: str = "") -> None:
    """The "after repair" part (swapkl evidence --repair bridge): the statement, the rule, the figure and the
    table of every signal's ρ against the raw and the bridged ground truth, with the bridge's contract."""
    import pandas as pd

    from swapkl.evidence import repair as R
    from swapkl.evidence.figures import repair_agreement
    from swapkl.evidence.report import repair_caption

    rep = d["repair"]
    st.subheader("After repair")
    st.markdown(f"**{rep['statement']}**")
    st.caption(f"rule (fixed before any number): {rep['rule']}")
    st.plotly_chart(common.memo("evidence_repair_fig", ek, lambda: repair_agreement(d)), key="ev_repair" + suffix)
    st.dataframe(pd.DataFrame(R.rows(rep)), hide_index=True, key="ev_repair_table" + suffix)
    st.caption(f"contract: {repair_caption(d)}")


def downloads(d: dict, suffix: str = "") -> None:
    from swapkl.evidence.report import csv_text

    st.markdown("**Downloads** (each carries its contract)")
    a, b = st.columns(2)
    with a:
        st.download_button("CSV", csv_text(d), file_name="evidence.csv", mime="text/csv", key="dl_ev_csv" + suffix)
    with b:
        common.download_json(d, "evidence", key="dl_ev_json" + suffix)


def body(job) -> None:
    if job.evidence is None:
        if job.running:
            st.info("The figures appear when the evidence is complete (ground truth, signals, bootstrap).")
        return
    ek = (content_key(job.evidence),)
    d = common.memo("evidence_dict", ek, job.evidence.to_dict)
    cap = results(d, ek)
    if job.running:
        return
    downloads(d)
    st.subheader("Export a pruned model")
    sigs = [sig for sig, per in d["stability"].items() if per]
    if not sigs:
        return
    e1, e2 = st.columns(2)
    sig = e1.selectbox("signal (the set its rule chose on the full sample)", sigs, key="w_ev_exp_sig")
    n = e2.selectbox("n", sorted(int(k) for k in d["stability"][sig]), key="w_ev_exp_n")
    removed = evidence_export(d, sig, n)
    common.export_view(job, removed, f"Export pruned model (remove {removed})", key="ev_export",
                       provenance={"chosen_by": f"{sig}, n={n} (evidence: its rule's set on the full sample)",
                                   "measured_on": cap}, identity=(d.get("contract") or {}).get("model"))


if job is not None:
    st.divider()
    common.live(job, body, "evidence", watch=("evidence",))
else:
    st.info("Press **Compute evidence**; evaluations already cached (ground truth, scores) are reused.")

with st.expander("Open an evidence file (`swapkl evidence --json`, e.g. with `--repair bridge`)"):
    upload = st.file_uploader("evidence JSON", type=["json"], key="ev_open")
if upload is not None:
    from swapkl.evidence.section import opened_evidence

    try:  # the size first, then parsed once per content (not on every rerun)
        opened = common.parsed_upload(upload, lambda raw: opened_evidence(raw, f"evidence file {upload.name}"),
                                      "evidence file")
    except SwapklError as e:
        st.error(str(e))
    else:
        st.divider()
        st.markdown(f"**Opened file {upload.name}**")
        try:  # the checks of opened_evidence cover what every figure reads first, not yet every part of the file
            results(opened, ("file", content_key(opened)), "_file")
            downloads(opened, "_file")
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            st.error(f"evidence file {upload.name}: a part of it is malformed ({type(e).__name__}: "
                     f"{' '.join(str(e).split())[:120]})")
