"""Shared UI helpers for the dashboard pages (not a page itself: ``app.py`` registers the pages explicitly
with ``st.navigation``).  Everything computed comes from the library; this module only wires widgets, the
job manager and downloads together.  Its helpers: :mod:`pages.session` (policy, session, the job manager),
:mod:`pages.widgets` (the start page's inputs), :mod:`pages.live_view` (a running job's status)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import streamlit as st

from swapkl import views
from swapkl.errors import SwapklError
from swapkl.jobs import AnalysisRequest, Job
from swapkl.removal.verdict import regime_verdict

from pages.live_view import MIN_REDRAW_S, VIEW_COST, browser_polls, has_content, live_component, progress_view
from pages.session import POLL_S, manager, policy, session_id, streamlit_session
from pages.widgets import contract_widgets, init_defaults, model_widgets, removal_widgets


def keep_widget_state() -> None:
    """Widget values survive page switches (Streamlit drops the state of widgets that are not drawn)."""
    for k in list(st.session_state.keys()):
        if isinstance(k, str) and k.startswith("w_"):
            st.session_state[k] = st.session_state[k]


# ============================================================================================ the request


def request_from_widgets() -> tuple[AnalysisRequest | None, str | None]:
    init_defaults()
    st.subheader("1 · Checkpoint")
    spec, rev = model_widgets()
    st.subheader("2 · Evaluation contract")
    contract, err = contract_widgets()
    st.subheader("3 · Layer budget")
    budget, methods, ev = removal_widgets(contract.device if contract else "auto")
    if err:
        return None, err
    if not spec:
        return None, "choose a checkpoint"
    return AnalysisRequest(model=spec, revision=rev, contract=contract, budget=budget, methods=methods,
                           evaluator=ev), None


def set_query(req: AnalysisRequest) -> None:
    c = req.contract
    q = {"model": req.model, "pairs": c.pairs, "prompts": c.prompts, "tokens": c.tokens,
         "positions": c.positions, "dtype": c.dtype, "device": c.device, "aggregation": c.aggregation,
         "seed": c.seed, "budget": req.budget, "methods": ",".join(req.methods),
         "evaluator": (req.evaluator or {}).get("name", "")}
    if req.revision:
        q["revision"] = req.revision
    try:
        st.query_params.from_dict({k: str(v) for k, v in q.items()})
    except Exception:  # deep links are a convenience
        pass


def request_caption(req) -> str:
    """The contract line of a request (what is shown before any result exists)."""
    if req is None:
        return ""
    if req.kind == "trajectory":
        return views.contract_caption(req.contract.provenance(model=f"trajectory: {req.checkpoints[:80]}"))
    model = req.model + (f"@{req.revision}" if req.revision else "")
    cap = views.contract_caption(req.contract.provenance(model=model),
                                 evaluator=req.evaluator if req.wants_curves else None)
    if req.wants_curves:
        cap += f"{views.SEP}budget {req.budget}{views.SEP}methods {', '.join(req.methods)}"
    return cap


# ============================================================================================ current job
def current_job(kind: str = "analysis") -> Job | None:
    """The job this session looks at: the one it started, else (a fresh tab or a refresh) the newest job of
    this kind that the server has."""
    mgr = manager()
    job = mgr.get(st.session_state.get(f"job_{kind}"), viewer=session_id())
    if job is None:
        for j in mgr.jobs(viewer=session_id()):  # never another session's opened file
            if j.request.kind == kind:
                job = j
                st.session_state[f"job_{kind}"] = j.key
                break
    return job


def start(request) -> Job | None:
    """Submit ``request`` for this session (the server's policy first: demo mode bounds the request and the
    jobs per session); a refusal is shown as one message and gives None."""
    pol = policy()
    try:
        pol.check_request(request)
        job = manager().submit(request, owner=session_id(),
                               max_active=pol.max_jobs_per_session if pol.demo else None,
                               max_total=pol.max_queued if pol.demo else None)
    except SwapklError as e:
        st.error(str(e), icon=":material/block:")
        return None
    st.session_state[f"job_{request.kind}"] = job.key
    return job


def find(request) -> Job | None:
    """The job of an identical request (another tab, before a refresh), if the policy allows the request."""
    try:
        policy().check_request(request)
    except SwapklError:
        return None
    return manager().find(request)


def live(job: Job | None, body, key: str, watch: tuple = ("result", "curves", "trajectory")) -> None:
    """Draw the job's status and ``body(job)``; while the job runs, keep them current at no cost to the
    computation, which shares the CPU with this server and the browser.

    The progress line is a small browser-side component that polls the job's progress file
    (``static/progress/<key>.json``, :meth:`swapkl.jobs.Job.progress_dict`) every ``POLL_S`` seconds -- no
    script run at all.  When the job has something new for this page (one of the parts in ``watch`` changed,
    the first result at once, when a step of the job ends, else at most every ``MIN_REDRAW_S`` seconds) or ends, the component triggers one
    rerun, which draws ``body`` anew (its figures and statistics are memoised on the result, :func:`memo`).
    Without static serving, a fragment polls the server instead (same redraw rule)."""
    if job is None:
        return
    if job.running and (sid := streamlit_session()) is not None:
        manager().watch(job.key, sid)  # this browser waits for it (a job nobody waits for is cancelled)
    c = VIEW_COST.get(job.key)
    if not job.running:
        if c is not None and not c.get("logged"):
            c["logged"] = True
            import logging

            logging.getLogger("swapkl.jobs").info("live view of job %s (%s): %d server polls, %.2f s drawing "
                                                  "progress, %d result redraws (at %s s)", job.key, key,
                                                  c["polls"], c["seconds"], c["redraws"], c.get("at"))
        progress_view(job)
        body(job)
        return
    seen = sum(job.updates[w] for w in watch)
    # nothing of the watched parts drawn yet: the first that arrives is drawn at once
    empty = not any(has_content(getattr(job, w, None)) for w in watch)
    c = VIEW_COST.setdefault(job.key, {"polls": 0, "seconds": 0.0, "redraws": 0, "at": []})
    c["redraws"] += 1
    c["at"].append(round(time.time() - (job.started or time.time()), 1))
    if browser_polls(job):
        live_component()(data={"url": f"app/static/progress/{job.progress_path.name}", "watch": list(watch),
                                "drawn": seen, "empty": empty, "progress": job.progress_dict(), "poll_ms": int(POLL_S * 1000),
                                "min_redraw_ms": int(MIN_REDRAW_S * 1000)},
                          key=f"live_{key}_{job.key}", on_redraw_change=lambda: None)
        progress_view(job, bar=False)
        body(job)
        return
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
    body(job)


def job_verdict(job: Job) -> dict | None:
    """The regime verdict of a job: the curves' (when computed) or from the adjacent pairs; None until every
    adjacent pair is scored."""

    if job.curves is not None and job.curves.verdict:
        return job.curves.verdict
    res = job.result
    if res is None:
        return None
    L = res.num_layers
    adjacent = [(i, i + 1) for i in range(L - 1)]
    have = set(res.pairs)
    if not all(p in have for p in adjacent):
        return None
    return regime_verdict(res.replacement(), res.interchange(), adjacent)


def lead_figure(job: Job, verdict: dict | None, key: str):
    """The figure a result leads with: the depth profile (both protocols against layer depth, CI bands,
    thresholds, best pairs) when only adjacent pairs exist -- their heatmaps would be blank but for a thin
    diagonal -- else the two heatmaps on one colour scale.  Returns the figure (for downloads)."""
    res = job.result
    rk = result_key(job)
    if views.is_adjacent_only(res):
        directed = st.toggle("Show the two directed replacement means R[i][i+1], R[i+1][i]", key=f"w_{key}_directed")
        fig = memo("depth", rk + (directed, (verdict or {}).get("regime")),
                   lambda: views.depth_profile(res, verdict=verdict, directed=directed))
        st.plotly_chart(fig, key=f"{key}_depth", width="stretch")
        st.caption("Adjacent pairs only (the heatmaps would be a thin diagonal): choose the pair set gap:K or all "
                   "for heatmaps. Bands: 95 % bootstrap CIs over prompts; stars: each protocol's best pair.")
    else:
        fig = memo("heatmaps", rk + ("linear", False), lambda: views.heatmaps(res))
        st.plotly_chart(fig, key=f"{key}_heatmaps", width="stretch")
    return fig


def memo(name: str, key: tuple, fn):
    """``fn()`` memoised per session under ``(name, *key)`` (figures are rebuilt only when their input changes,
    not on every one-second poll)."""
    store = st.session_state.setdefault("_memo", {})
    k = (name, *key)
    if k not in store:
        if len(store) > 64:
            store.clear()
        store[k] = fn()
    return store[k]


def result_key(job: Job) -> tuple:
    """What identifies the drawable state of a job: its key, the pairs and curves finished so far."""
    res, cv = job.result, job.curves
    return (job.key, len(res.pairs) if res is not None else -1, tuple(cv.methods) if cv is not None else (),
            id(res), id(cv))


# ============================================================================================ downloads
def safe_name(s: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in s)
    return keep.strip("-")[:60] or "swapkl"


def export_view(job: Job, removed, label: str, key: str = "export", merge: dict | None = None,
                provenance: dict | None = None, identity: dict | None = None) -> None:
    """Export the job's model with layers ``removed`` deleted: a Hugging Face folder (reloads with
    ``from_pretrained``), a mergekit passthrough YAML, or a pruned GGUF when the model came from one
    (:mod:`swapkl.surgery.exports`; a merge exports only as a folder).  ``provenance``: what chose the set and
    what it was measured on, for the YAML header; ``identity``: the model's, when the job has no score result.

    Local server: an output path typed here (an existing one needs the "replace" box).  Demo mode: no path
    from the browser -- the server writes ``<cache>/exports/<name derived from model, fingerprint and layers>``
    (reused when already exported) and offers it as a download."""
    from swapkl.store import cache_root
    from swapkl.surgery.exports import FILE_SUFFIX, FORMAT_LABELS, gguf_source, mergekit_model_ref
    from swapkl.surgery.outputs import folder_zip

    pol = policy()
    ident = identity or (job.result.identity if job.result is not None else None) or {}
    tail = job.request.model.rstrip("/").split("/")[-1] + (f"@{job.request.revision}" if job.request.revision else "")
    what = (f"merged-{merge['mode']}-" + "-".join("+".join(map(str, g)) for g in merge["groups"])) if merge else \
        f"minus-{'-'.join(map(str, removed))}"
    fmts = ["hf"] if merge else ["hf", "mergekit"] + (["gguf"] if gguf_source(ident) is not None else [])
    fmt = st.radio("format", fmts, format_func=FORMAT_LABELS.get, horizontal=True, key=f"w_{key}_fmt")
    name = safe_name(f"{tail}-{str(ident.get('fingerprint') or '')[:8]}-{what}") + FILE_SUFFIX.get(fmt, "")
    ref = None  # a demo server's YAML names no path of its own: the hub id, else a folder the user fills in
    if pol.demo and fmt == "mergekit":
        ref = mergekit_model_ref(ident) if ident.get("kind") == "hub" else f"./{safe_name(tail)}"
    if pol.demo:
        out = pol.export_dir(name, cache_root())
        st.caption(f"The server saves it as `exports/{out.name}` and offers it for download.")
        force = out.exists()
    else:
        out = st.text_input("output " + ("folder" if fmt == "hf" else "file"), value=str(cache_root() / "exports" / name),
                            key=f"w_{key}_out_{name}")
        force = st.checkbox("replace an existing export there", key=f"w_{key}_force")
    if st.button(label, key=key):
        try:
            with st.spinner("saving…"):
                path = manager().export_pruned(job, list(removed), out, force=force, merge=merge, fmt=fmt,
                                               provenance=provenance, model_ref=ref)
            st.session_state[f"_export_{key}"] = str(path)
        except SwapklError as e:
            st.error(str(e))
        except Exception as e:  # shown, the app keeps working
            st.error(f"export failed: {type(e).__name__}: {e}")
    done = st.session_state.get(f"_export_{key}")
    if done and Path(done).name == Path(out).name:
        how = {"hf": "reload with AutoModelForCausalLM.from_pretrained", "mergekit": "run: mergekit-yaml FILE OUT_DIR",
               "gguf": "runs in llama.cpp; transformers reads it with gguf_file="}[fmt]
        st.success(f"Saved to {done if not pol.demo else 'exports/' + Path(done).name} ({how}).")
        if fmt == "hf":
            st.download_button("⬇ pruned model (zip)", data=lambda: folder_zip(done), file_name=f"{Path(done).name}.zip",
                               mime="application/zip", key=f"dl_{key}", on_click="ignore")
        else:
            st.download_button(f"⬇ {Path(done).name}", data=lambda: Path(done).read_bytes(), file_name=Path(done).name,
                               mime="application/octet-stream", key=f"dl_{key}", on_click="ignore")


def download_figure(fig, name: str, key: str) -> None:
    st.download_button(f"⬇ {name} (HTML)", data=lambda: views.figure_html(fig), file_name=f"{safe_name(name)}.html",
                       mime="text/html", key=key, on_click="ignore")


def download_table(df, caption, name: str, key: str) -> None:
    st.download_button(f"⬇ {name} (CSV)", data=views.table_csv(df, caption), file_name=f"{safe_name(name)}.csv",
                       mime="text/csv", key=key, on_click="ignore")


def downloads(fig, table, caption, obj_json: dict | str, name: str, key: str) -> None:
    """A panel's downloads side by side: its figure (HTML), table (CSV with the contract) and result (JSON)."""
    st.markdown("**Downloads** (each carries its contract)")
    for col, (part, draw, args) in zip(st.columns(3), (("figure", download_figure, (fig, name)),
                                                     ("table", download_table, (table, caption, name)),
                                                     ("json", download_json, (obj_json, name)))):
        with col:
            draw(*args, key=f"dl_{key}_{part}")


def download_json(obj_json: dict | str, name: str, key: str) -> None:
    data = obj_json if isinstance(obj_json, str) else json.dumps(obj_json, indent=1, allow_nan=False, default=str)
    st.download_button(f"⬇ {name} (JSON)", data=data, file_name=f"{safe_name(name)}.json",
                       mime="application/json", key=key, on_click="ignore")


def result_json(job: Job) -> dict:
    """The whole analysis as one JSON object (swap-KL result, removal curves, request), contract included."""
    out = {"format": "swapkl.dashboard/1", "request": job.request.to_dict(), "created": time.time()}
    if job.result is not None:
        out["result"] = job.result.to_dict()
    if job.curves is not None:
        out["curves"] = job.curves.to_dict()
    return out


def report_html(job: Job | None, traj_job: Job | None = None, *others: Job | None) -> str:
    """The one-click demo report (:func:`swapkl.views.report.build_report`) of what this session has: the analysis,
    the trajectory, and a section for each finished job in ``others`` that has one (evidence, healing)."""
    from swapkl.views.report import build_report

    return build_report(result=job.result if job else None, curves=job.curves if job else None,
                        trajectory=traj_job.trajectory if traj_job else None,
                        sections=[sec for j in others for sec in job_sections(j, job)])


def evidence_done(ev_job: Job | None) -> bool:
    return ev_job is not None and ev_job.status == "done" and ev_job.evidence is not None


def job_sections(j: Job | None, analysis: Job | None = None) -> list:
    """The report sections a finished job adds (tiers above views build them): evidence, healed curves, task
    accuracy (only for the model of ``analysis``, when given)."""
    if evidence_done(j):
        from swapkl.evidence.section import section

        return [section(j.evidence)]
    if j is not None and getattr(j, "heal", None) is not None:
        from swapkl.healing.figures import section

        return [section(j.heal)]
    if j is not None and getattr(j, "tasks", None) is not None:
        from pages.tasks_panel import report_sections

        return report_sections(analysis, j)
    return []


def report_button(key: str) -> None:
    """Offer the demo report of the current analysis (and trajectory, when there is one) as a download."""
    job, traj = current_job("analysis"), current_job("trajectory")
    ev, heal, tasks = current_job("evidence"), current_job("heal"), current_job("tasks")
    have = (job is not None and job.result is not None) or (traj is not None and traj.trajectory is not None) \
        or evidence_done(ev)
    if not have:
        return
    st.download_button("⬇ Demo report (HTML)", data=lambda: report_html(job, traj, ev, heal, tasks),
                       file_name="swapkl-report.html",
                       mime="text/html", key=key, on_click="ignore",
                       help="one self-contained HTML page: verdict, heatmaps, curves, trajectory, contract")


def sidebar() -> None:
    """Always visible: the current job's contract and status, other running jobs, the report."""
    with st.sidebar:
        job = current_job("analysis")
        st.markdown("**Current analysis**")
        if job is None:
            st.caption("none yet — start one on the Start page")
        else:
            st.caption(f"{job.status}: {request_caption(job.request)}")
        others = [j for j in manager().jobs(viewer=session_id()) if j.running and (job is None or j.key != job.key)]
        if others:
            st.markdown("**Also running**")
            for j in others:
                st.caption(f"{j.status}: {j.request.label()}")
        report_button("report_sidebar")


def need_result(kind: str = "analysis") -> Job | None:
    """The current job if it has something to draw, else an explanation on the page and None."""
    job = current_job(kind)
    if job is None:
        st.info("No computation yet: choose a checkpoint and a contract on the Start page and press Compute.")
        return None
    return job
