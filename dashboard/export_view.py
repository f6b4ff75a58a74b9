"""Exporting a job's model with a set of layers removed (or merged): the format, where it goes, the button and the
download (in demo mode an export job of the queue, :mod:`swapkl.jobs.export_job`).  What can be exported and under which name is :mod:`swapkl.jobs.exports`; the writing is
:meth:`swapkl.jobs.JobManager.export_pruned`."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.current import start
from dashboard.session import POLL_S, manager, policy, session_id
from swapkl.errors import SwapklError
from swapkl.jobs import Job
from swapkl.jobs.export_job import ExportRequest
from swapkl.jobs.exports import SAVED_HOW, demo_model_ref, export_formats, export_identity, export_name


#: the one line a browse-only job gets instead of an export button (demo mode: a model this server does not offer)
BROWSE_ONLY = "this demo server exports only the models it offers"


def export_view(job: Job, removed, label: str, key: str = "export", merge: dict | None = None,
                provenance: dict | None = None, identity: dict | None = None) -> None:
    """Export the job's model with layers ``removed`` deleted: a Hugging Face folder (reloads with
    ``from_pretrained``), a mergekit passthrough YAML, or a pruned GGUF when the model came from one
    (:mod:`swapkl.surgery.exports`; a merge exports only as a folder).  ``provenance``: what chose the set and
    what it was measured on, for the YAML header; ``identity``: the model's, when the job has no score result.

    Local server: an output path typed here (an existing one needs the "replace" box), written at once.  Demo mode:
    no path from the browser -- an export job of the queue (:mod:`swapkl.jobs.export_job`, bounded like every
    computation) writes ``<cache>/exports/<name derived from the whole request>`` and its zip, and the page offers
    exactly those bytes.  A browse-only job (an opened file of a model this server does not offer) gets one line."""
    from swapkl.store import cache_root
    from swapkl.surgery.exports import FORMAT_LABELS

    if job.browse_only:  # an opened file of a model this demo server does not offer: browsed, never loaded
        st.info(BROWSE_ONLY)
        return
    pol = policy()
    ident = export_identity(job, identity)
    fmt = st.radio("format", export_formats(ident, merge), format_func=FORMAT_LABELS.get, horizontal=True,
                   key=f"w_{key}_fmt")
    name = export_name(job.request, ident, removed, fmt, merge)
    if pol.demo:
        # a demo server's YAML names no path of its own: the hub id, else a folder the user fills in
        ref = demo_model_ref(job.request, ident) if fmt == "mergekit" else None
        req = ExportRequest(**_demo_fields(job, name, pol), removed=tuple(removed), fmt=fmt, merge=merge,
                            provenance=provenance, model_ref=ref)
        _demo_export(req, label, key)
        return
    out = st.text_input("output " + ("folder" if fmt == "hf" else "file"), value=str(cache_root() / "exports" / name),
                        key=f"w_{key}_out_{name}")
    force = st.checkbox("replace an existing export there", key=f"w_{key}_force")
    if st.button(label, key=key):
        try:
            with st.spinner("saving…"):
                path = manager().export_pruned(job, list(removed), out, force=force, merge=merge, fmt=fmt,
                                               provenance=provenance)
            st.session_state[f"_export_{key}"] = str(path)
        except SwapklError as e:
            st.error(str(e))
        except Exception as e:  # shown, the app keeps working
            st.error(f"export failed: {type(e).__name__}: {e}")
    done = st.session_state.get(f"_export_{key}")
    if done and Path(done).name == Path(out).name:
        _saved(done, fmt, key)


def _demo_fields(job: Job, name: str, pol) -> dict:
    """The fields of a demo export request that come from the job and the server (never from the browser)."""
    from swapkl.store import cache_root

    req, c = job.request, job.request.contract
    return {"model": req.model, "revision": req.revision, "dtype": c.dtype, "device": c.device, "name": name,
            "root": str(pol.export_dir(name, cache_root()).parent), "quota_bytes": int(pol.export_quota_mb) << 20,
            "max_age_s": float(pol.export_max_age_h) * 3600.0}


def _demo_export(req: ExportRequest, label: str, key: str) -> None:
    """A demo server's export: the button submits the export job (refusals: one line); its state, then its
    download, follow."""
    st.caption(f"The server saves it as `exports/{req.name}` and offers it for download.")
    if st.button(label, key=key):
        ej = start(req)
        if ej is not None:
            st.session_state[f"_export_job_{key}"] = ej.key
    ej = manager().get(st.session_state.get(f"_export_job_{key}"), viewer=session_id())
    if ej is None or ej.request.name != req.name:
        return
    if ej.running:
        _wait(ej)
    elif ej.status != "done" or not ej.export:
        st.error(ej.error or f"export {ej.status}")
    else:
        _offered(ej.export, key)


def _wait(ej: Job) -> None:
    """The export job's progress line, redrawn until it finishes (then the page runs again)."""
    @st.fragment(run_every=POLL_S)
    def _poll():
        st.info(ej.progress_line() if ej.status == "queued" else f"exporting… {ej.progress().phase}")
        if not ej.running:
            st.rerun(scope="app")

    _poll()


def _offered(rec: dict, key: str) -> None:
    """The demo export's line and its download: exactly the bytes written by the job (``rec["download"]``), under
    a file name that holds the set and the request's hash; gone (the quota removed it): say so."""
    dl = Path(rec["download"])
    if not dl.is_file():
        st.warning(f"exports/{dl.name} was removed by the server's export quota; export it again")
        return
    st.success(f"Saved as exports/{Path(rec['path']).name}, removing {rec['removed']} ({SAVED_HOW[rec['fmt']]}).")
    mime = "application/zip" if dl.suffix == ".zip" else "application/octet-stream"
    what = "pruned model (zip)" if dl.suffix == ".zip" else dl.name
    st.download_button(f"⬇ {what}", data=lambda: dl.read_bytes(), file_name=rec["file_name"], mime=mime,
                       key=f"dl_{key}", on_click="ignore")


def _saved(done: str, fmt: str, key: str) -> None:
    """A local export's line and its download (a folder as a zip)."""
    from swapkl.surgery.outputs import folder_zip

    st.success(f"Saved to {done} ({SAVED_HOW[fmt]}).")
    if fmt == "hf":
        st.download_button("⬇ pruned model (zip)", data=lambda: folder_zip(done), file_name=f"{Path(done).name}.zip",
                           mime="application/zip", key=f"dl_{key}", on_click="ignore")
    else:
        st.download_button(f"⬇ {Path(done).name}", data=lambda: Path(done).read_bytes(), file_name=Path(done).name,
                           mime="application/octet-stream", key=f"dl_{key}", on_click="ignore")


def export_healed_view(job: Job, method: str, n: int, anyway: bool = False) -> None:
    """Export the healed model of ``method`` at ``n`` of the heal job ``job`` as a merged Hugging Face folder
    (:func:`swapkl.jobs.heal_export.export_healed_model`; ``anyway``: the user ticked "export anyway" for a heal that
    made its model worse).  Where it goes as in :func:`export_view`: a typed folder written at once locally; in demo
    mode an export job writes the server's ``exports/`` and its zip, offered as the download."""
    from swapkl.jobs.heal_export import export_healed_model, healed_entry, healed_export_name
    from swapkl.store import cache_root

    if job.browse_only:  # an opened file of a model this demo server does not offer: browsed, never loaded
        st.info(BROWSE_ONLY)
        return
    pol = policy()
    name = healed_export_name(job, method, n)
    label = f"Export healed model ({method}, n = {n})"
    if pol.demo:
        req = ExportRequest(**_demo_fields(job, name, pol), removed=tuple(healed_entry(job.heal, method, n)["removed"]),
                            heal={"method": method, "n": int(n), "anyway": bool(anyway), "job": job.key}, source=job)
        _demo_export(req, label, "heal_export")
        return
    out = st.text_input("output folder", value=str(cache_root() / "exports" / name), key=f"w_heal_exp_out_{name}")
    replace = st.checkbox("replace an existing export there", key="w_heal_exp_replace")
    if st.button(label, key="heal_export"):
        try:
            with st.spinner("healing from the cache and saving…"):
                path = export_healed_model(manager(), job, method, n, out, replace=replace, anyway=anyway)
            st.session_state["_export_heal_export"] = str(path)
        except SwapklError as e:
            st.error(str(e))
        except Exception as e:  # shown, the app keeps working
            st.error(f"export failed: {type(e).__name__}: {e}")
    done = st.session_state.get("_export_heal_export")
    if done and Path(done).name == Path(out).name:
        _saved(done, "hf", "heal_export")
