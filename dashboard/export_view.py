"""Exporting a job's model with a set of layers removed (or merged): the format, where it goes, the button and the
download.  What can be exported and under which name is :mod:`swapkl.jobs.exports`; the writing is
:meth:`swapkl.jobs.JobManager.export_pruned`."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard.session import manager, policy
from swapkl.errors import SwapklError
from swapkl.jobs import Job
from swapkl.jobs.exports import SAVED_HOW, demo_model_ref, export_formats, export_identity, export_name


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
    from swapkl.surgery.exports import FORMAT_LABELS

    pol = policy()
    if job.browse_only:  # an opened file of a model this demo server does not offer: browsed, never loaded
        st.info("This file's model is not on this demo server's list: its results can be browsed, not exported.")
        return
    ident = export_identity(job, identity)
    fmt = st.radio("format", export_formats(ident, merge), format_func=FORMAT_LABELS.get, horizontal=True,
                   key=f"w_{key}_fmt")
    name = export_name(job.request, ident, removed, fmt, merge)
    # a demo server's YAML names no path of its own: the hub id, else a folder the user fills in
    ref = demo_model_ref(job.request, ident) if pol.demo and fmt == "mergekit" else None
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
        _saved(done, fmt, pol.demo, key)


def _saved(done: str, fmt: str, demo: bool, key: str) -> None:
    """The saved export's line and its download (a folder as a zip)."""
    from swapkl.surgery.outputs import folder_zip

    st.success(f"Saved to {done if not demo else 'exports/' + Path(done).name} ({SAVED_HOW[fmt]}).")
    if fmt == "hf":
        st.download_button("⬇ pruned model (zip)", data=lambda: folder_zip(done), file_name=f"{Path(done).name}.zip",
                           mime="application/zip", key=f"dl_{key}", on_click="ignore")
    else:
        st.download_button(f"⬇ {Path(done).name}", data=lambda: Path(done).read_bytes(), file_name=Path(done).name,
                           mime="application/octet-stream", key=f"dl_{key}", on_click="ignore")


def export_healed_view(job: Job, method: str, n: int, anyway: bool = False) -> None:
    """Export the healed model of ``method`` at ``n`` of the heal job ``job`` as a merged Hugging Face folder
    (:func:`swapkl.jobs.heal_export.export_healed_model`; ``anyway``: the user ticked "export anyway" for a heal that
    made its model worse).  Where it goes as in :func:`export_view`: a typed folder locally, the server's
    ``exports/`` in demo mode (then offered as a zip)."""
    from swapkl.jobs.heal_export import export_healed_model, healed_export_name
    from swapkl.store import cache_root

    pol = policy()
    if job.browse_only:
        st.info("This file's model is not on this demo server's list: its results can be browsed, not exported.")
        return
    name = healed_export_name(job, method, n)
    if pol.demo:
        out = pol.export_dir(name, cache_root())
        replace = out.exists()
    else:
        out = st.text_input("output folder", value=str(cache_root() / "exports" / name), key=f"w_heal_exp_out_{name}")
        replace = st.checkbox("replace an existing export there", key="w_heal_exp_replace")
    if st.button(f"Export healed model ({method}, n = {n})", key="heal_export"):
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
        _saved(done, "hf", pol.demo, "heal_export")
