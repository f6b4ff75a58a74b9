"""swapkl dashboard: ``streamlit run app.py``.

Start page (this file): checkpoint, evaluation contract, layer budget, one Compute button, opening saved results,
live progress and the summary (the lead figure, the regime verdict with its evidence, the evidence headline, the
recommended removal with its export, best pairs per protocol, gap statistics).  Other pages, registered below with
``st.navigation`` and their URLs: ``pages/heatmaps.py`` (/heatmaps), ``pages/curves.py`` (/curves: removal curves
with the task-accuracy, healing and recommendation panels), ``pages/trajectory.py`` (/trajectory),
``pages/evidence.py`` (/evidence), ``pages/compare.py`` (/compare), ``pages/study.py`` (/study: a study across models).  What they share is in ``dashboard/common.py`` and its helper modules
(docs/architecture.md).  All computation runs in the library through :class:`swapkl.jobs.JobManager` (one per
server, held by ``st.cache_resource``); pages only draw.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import streamlit as st  # noqa: E402

from dashboard import common, linked  # noqa: E402
from swapkl.errors import SwapklError  # noqa: E402


def start_page() -> None:
    st.title("swapkl — protocol-aware layer redundancy")
    st.caption("Replacement runs block j's weights in slot i; interchange swaps blocks i and j; both are scored as "
               "KL(base ‖ variant) in nats (swap-KL). Lower = more redundant.")
    mgr = common.manager()
    # once this session shows a result, the settings fold away so the result is the first thing on screen
    me = common.session_id()
    showing = mgr.get(st.session_state.get("job_analysis"), viewer=me) is not None or bool(st.session_state.get("compute"))
    with st.expander("Checkpoint · evaluation contract · layer budget", expanded=not showing, icon=":material/tune:"):
        request, err = common.request_from_widgets()
    st.markdown("**Contract**")
    if err:
        st.error(err)
    else:
        st.code(common.request_caption(request), language=None, wrap_lines=True)
    go = st.button("Compute", type="primary", disabled=request is None, key="compute")
    opened = open_files_view()
    job = None
    if go and request is not None:
        st.session_state.pop("job_pinned", None)
        job = common.start(request)
        if job is not None:
            common.set_query(request)
    elif opened is not None or st.session_state.get("job_pinned"):
        job = opened or mgr.get(st.session_state.get("job_pinned"), viewer=me)
    elif request is not None:
        job = common.find(request)  # the same request running in another tab / before a refresh
        if job is not None:
            st.session_state["job_analysis"] = job.key
    if job is None:
        job = common.current_job("analysis")
    if job is None:
        st.info("Nothing computed yet. Press **Compute**: results that are already cached show at once.")
        from swapkl import views as plots

        st.plotly_chart(common.memo("frame", (), plots.profile_frame), key="start_frame", width="stretch")
        return
    if request is None or job.request != request:
        st.caption(f"Showing the last analysis ({job.request.label()}); press Compute for the settings above.")
    st.divider()
    common.live(job, summary_view, "summary", watch=("result",))


def open_files_view():
    """Browse results computed elsewhere (a cluster run's merged ``--json``, a colleague's files) without the
    model: returns the opened job, or None."""
    with st.expander("Open saved results (a `score --json` file, optionally with its `curves --json`, or a `swapkl bundle`)"):
        res_file = st.file_uploader("result JSON or bundle", type=["json"], key="open_result")
        curves_file = st.file_uploader("curves JSON (optional)", type=["json"], key="open_curves")
        if st.button("Open", key="open_files", disabled=res_file is None):
            try:
                data, cdata = common.checked_upload(res_file, curves_file)  # the size first, nothing read before
                job = common.manager().open_files(data, cdata if curves_file is not None else None,
                                                  owner=common.session_id())
            except SwapklError as e:
                st.error(str(e))
                return None
            st.session_state["job_analysis"] = job.key
            st.session_state["job_pinned"] = job.key
            return job
    return None


def recommendation_view(job) -> None:
    """The answer to "which n layers should I remove?" when the curves ran the ``recommend`` method: per n the
    set, its held-out ΔPPL with CI and one sentence of evidence, with its contract and an export."""
    from swapkl.errors import SwapklError
    from swapkl.removal.recommend import Recommendation

    curves = job.curves
    if curves is None or job.running:
        return
    if "recommend" not in (curves.methods or {}) or not curves.methods["recommend"]:
        st.caption("Which layers to remove? Add **recommended** to the removal methods (settings) for a search "
                   "over removal sets seeded by every method and scored on calibration text (a few minutes on a CPU).")
        return
    try:
        rec = common.memo("recommendation", common.result_key(job), lambda: Recommendation.from_curves(curves))
    except SwapklError as e:
        st.warning(f"no recommendation: {e}")
        return
    ns = [e["n"] for e in rec.entries]
    st.subheader("Recommended removal")
    n = st.select_slider("layers to remove", ns, value=ns[-1], key="w_rec_n") if len(ns) > 1 else ns[0]
    e = rec.entry(n)
    lo, hi = e.get("delta_pct_ci") or (None, None)
    ci = f" [{lo:+.1f}, {hi:+.1f}]" if lo is not None and hi is not None else ""
    st.success(f"remove layers {{{', '.join(map(str, e['removed']))}}}: ΔPPL {e['delta_pct']:+.1f} %{ci}")
    st.write(rec.explain(n))
    from swapkl import views as plots

    st.caption(f"contract: {plots.contract_caption(rec)}")
    with st.expander("Export the recommended model"):
        common.export_view(job, e["removed"], f"Export pruned model (remove {e['removed']})", key="export_rec",
                           provenance={"chosen_by": f"recommend, n={n}", "measured_on": plots.contract_caption(rec)})


def evidence_line(job) -> None:
    """The evidence headline (docs/evidence.md) for this model and contract when an evidence job has finished,
    else a pointer to the Evidence page."""
    from swapkl.jobs.reports import matching_evidence

    ev = matching_evidence(common.manager().jobs(viewer=common.session_id()), job.request)
    if ev is not None:
        st.markdown(f"**How far to trust it:** {ev['headline']}")
    st.page_link("pages/evidence.py", label="Evidence: ground truth, agreement and stability of every layer signal",
                 icon=":material/fact_check:")


def summary_view(job) -> None:
    """The first view (below the progress line that :func:`dashboard.common.live` draws): the lead figure (depth profile for adjacent pairs, else the heatmaps), the
    regime verdict with its evidence, best pairs and the gap statistics.  Everything derived from the result is
    memoised on the result's content (:func:`dashboard.common.memo`), so a poll that finds nothing new only
    redraws the progress bar's text."""
    from swapkl import views as plots

    res = job.result
    if res is None or not res.pairs:
        return
    rk = common.result_key(job)
    cap = common.memo("caption", rk, lambda: plots.contract_caption(res))
    st.caption(f"contract: {cap}")
    if getattr(job, "bundle", None):  # a demo bundle: shown as computed elsewhere, nothing recomputed
        st.caption(job.bundle)
    verdict = common.memo("verdict", rk, lambda: common.job_verdict(job))
    mark = linked.marked(job)  # a removal set clicked on the Removal curves page, marked on the lead figure
    linked.heatmap_marks(job)
    common.lead_figure(job, verdict, key="start", marks=mark and mark["removed"])
    st.subheader("Regime verdict")
    L = res.num_layers
    if verdict is None:
        n_adj = sum(1 for i, j in res.pairs if j - i == 1)
        st.info(f"The verdict needs all {L - 1} adjacent pairs; {n_adj} are done so far.")
    else:
        st.markdown(f"### {verdict['regime']} — prefer {verdict['prefer']}")
        st.write(verdict["sentence"])
    evidence_line(job)
    if job.running:  # while computing, redraws stay light: the figure and the verdict; the tables come at the end
        st.caption("Evidence tables, best pairs and the gap statistics follow when the run is done.")
        return
    recommendation_view(job)
    if verdict is not None:
        ev = verdict["evidence"]
        rows = []
        for name in ("replacement", "interchange"):
            e = ev[name]
            rows.append({"protocol": name, "pairs": e["n_pairs"], "< 0.05 nats": e["below_0.05"],
                         f"< {ev['threshold']:g} nats": e["below_threshold"], "min (nats)": e["min"],
                         "median (nats)": e["median"], "best pair": f"{e['best_pair'][0]}-{e['best_pair'][1]}"})
        st.dataframe(rows, hide_index=True, key="verdict_table")
        kr = ev.get("kl_ratio_median")
        st.caption(f"Evidence on the adjacent pairs · KL ratio d_inter/d_repl: median "
                   f"{kr:.3f}" if kr is not None else "Evidence on the adjacent pairs")
    s = common.memo("summary", rk, res.summary)
    st.subheader("Best pairs per protocol")
    c1, c2 = st.columns(2)
    for col, name in ((c1, "replacement"), (c2, "interchange")):
        e = s[name]
        col.metric(f"best {name} pair", f"{e['best_pair'][0]}-{e['best_pair'][1]}", f"{e['best']:.4g} nats",
                   delta_color="off")
        col.caption(f"{e['strong']} pairs < 0.05 nats, {e['conditional']} < 0.10 nats of {s['pairs']}; "
                    f"median {e['median']:.4g} nats")
    st.dataframe(common.memo("top5", rk, lambda: plots.top_pairs_table(res, 5)), hide_index=True, key="top5")
    st.subheader("Gap d_repl − d_inter (nats)")
    g = s["gap"]
    gc = st.columns(4)
    for col, k in zip(gc, ("mean", "median", "p75", "max")):
        ci = g.get(f"{k}_ci")
        col.metric(k, f"{g[k]:.4g}", f"95% CI [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else None, delta_color="off")
    pear = s.get("pearson")
    nf = s.get("noise_floor")
    st.caption(f"{s['pairs']} pairs · {g['negative_pairs']} with a negative gap · KL ratio d_inter/d_repl median "
               f"{s['kl_ratio']['median']:.3f} · Pearson r of the two protocols "
               f"{'n/a' if pear is None else f'{pear:.3f}'} · numerical noise floor "
               f"{'n/a' if nf is None else f'{nf:.2e}'} nats")
    if job.curves is not None and job.curves.methods:
        st.caption("Removal curves are ready on the **Removal curves** page; heatmaps on **Heatmaps**.")
    if not job.running:
        common.download_json(common.result_json(job, public=common.policy().demo), "swapkl-result",
                             key="dl_json_start")


def main() -> None:
    st.set_page_config(page_title="swapkl", page_icon=":material/swap_horiz:", layout="wide")
    # the server's job manager, made on the first script run of the server, whichever page it opens: it starts
    # the heavy imports (torch, transformers, the engine) on a background thread behind one lock
    # (swapkl.heavy) before any job or other session can race for them; the page paints meanwhile
    common.manager()
    common.keep_widget_state()
    pages = [st.Page(start_page, title="Start", icon=":material/home:", default=True),
             st.Page(str(HERE / "pages" / "heatmaps.py"), title="Heatmaps", icon=":material/grid_on:", url_path="heatmaps"),
             st.Page(str(HERE / "pages" / "curves.py"), title="Removal curves", icon=":material/trending_up:", url_path="curves"),
             st.Page(str(HERE / "pages" / "trajectory.py"), title="Training trajectory", icon=":material/timeline:",
                     url_path="trajectory"),
             st.Page(str(HERE / "pages" / "evidence.py"), title="Evidence", icon=":material/fact_check:",
                     url_path="evidence"),
             st.Page(str(HERE / "pages" / "compare.py"), title="Compare", icon=":material/compare:", url_path="compare"),
             st.Page(str(HERE / "pages" / "study.py"), title="Study", icon=":material/table_chart:", url_path="study")]
    nav = st.navigation(pages)
    common.sidebar()
    nav.run()


main()
