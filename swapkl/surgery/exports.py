"""Export a removal set in the format the user runs: a Hugging Face folder, a mergekit passthrough YAML, or a
pruned GGUF.

* ``hf`` (default): :func:`swapkl.surgery.prune.save_pruned` -- config updated, ``layer_idx`` renumbered,
  ``swapkl_prune.json`` beside the weights; also the only format for a *merged* (LaCo) model;
* ``mergekit``: :mod:`swapkl.surgery.mergekit` -- 0-based ``layer_range: [a, b)`` slices of the source, with the
  evaluation contract in a comment header; mergekit reads Hugging Face folders or hub ids, so a GGUF source is
  referenced by its float32 conversion in the cache;
* ``gguf``: :mod:`swapkl.surgery.gguf_prune` -- only when the source *is* a GGUF (a ``.gguf`` file or the built-in
  default); the quantised blocks are copied as they are, and the equivalent ``llama-quantize --prune-layers``
  line comes with it.

Every export validates the removal set against the source's layer count first and refuses an output path the
way ``prune --out`` does (never the source, never over an existing export without ``force``).  No torch at import.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from swapkl.errors import SwapklError
from swapkl.surgery.removal_set import kept_layers, validate_remove

FORMATS = ("hf", "mergekit", "gguf")
FORMAT_LABELS = {"hf": "Hugging Face folder (safetensors)", "mergekit": "mergekit passthrough YAML",
                 "gguf": "pruned GGUF (quantised blocks copied as they are)"}
FILE_SUFFIX = {"mergekit": ".yaml", "gguf": ".gguf"}


class ExportError(SwapklError):
    """An export that cannot be made from this source (a GGUF from a non-GGUF model, a merge as a YAML)."""


def check_format(fmt: str, merge=None) -> str:
    """``fmt`` if it is a known format that can carry this export (a merge exports only as ``hf``)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format '{fmt}'; choose one of {', '.join(FORMATS)}")
    if merge is not None and fmt != "hf":
        raise ExportError(f"a merged model has new weights: it exports only as a Hugging Face folder (hf), not {fmt}")
    return fmt


def gguf_source(identity: dict | None) -> Path | None:
    """The GGUF file a model was loaded from (its identity's ``kind`` is ``gguf`` or ``builtin``), else None."""
    ident = identity or {}
    if ident.get("kind") == "gguf" and ident.get("id"):
        return Path(ident["id"])
    if ident.get("kind") == "builtin":
        from swapkl.model.builtin import default_gguf_path

        return default_gguf_path()
    return None


def require_gguf_source(identity: dict | None) -> Path:
    """:func:`gguf_source`, or an :class:`ExportError` that says what to do instead."""
    src = gguf_source(identity)
    if src is None:
        ident = identity or {}
        what = ident.get("display") or ident.get("id") or "this model"
        raise ExportError(f"a pruned GGUF needs a GGUF source (a .gguf file or the built-in default); {what} is a "
                          f"{ident.get('kind', 'non-GGUF')} model: export a Hugging Face folder (--format hf) and "
                          "convert that with llama.cpp's convert_hf_to_gguf.py")
    return src


def mergekit_model_ref(identity: dict | None, folder: str | None = None) -> str:
    """What mergekit should load: ``org/name@commit`` (or ``@revision``) for a hub model, the folder for a local
    one, and for a GGUF source the float32 Hugging Face conversion ``folder`` (mergekit cannot read GGUF)."""
    ident = identity or {}
    if ident.get("kind") == "hub":
        rev = ident.get("commit") or ident.get("revision")
        return f"{ident['id']}@{rev}" if rev and rev != "main" else str(ident["id"])
    if ident.get("kind") == "local":
        return str(ident["id"])
    if folder:
        return str(folder)
    raise ExportError("no Hugging Face folder to point mergekit at for this model")


def contract_header(identity: dict | None, provenance: dict | None = None) -> dict:
    """The comment header of a mergekit YAML: model, revision (or fingerprint), and from ``provenance`` the
    method that chose the set (``chosen_by``) and what it was measured on (``measured_on``)."""
    ident = identity or {}
    head = {"model": ident.get("display") or ident.get("id"),
            "revision": ident.get("commit") or ident.get("revision")
            or (f"sha256 {str(ident['fingerprint'])[:16]}" if ident.get("fingerprint") else None)}
    if ident.get("kind") in ("gguf", "builtin"):
        head["source"] = f"{Path(str(ident.get('id'))).name}, read through its float32 Hugging Face conversion"
    head.update({k: v for k, v in (provenance or {}).items() if v is not None})
    return head


def export_mergekit(remove: Iterable[int], num_layers: int, model_ref: str, out: str | os.PathLike,
                    dtype: str = "float32", contract: dict | None = None, force: bool = False, inputs: Iterable = (),
                    force_hint: str = "--force") -> dict:
    """Write the mergekit YAML for removing ``remove`` to ``out``; returns ``{"format", "path", "removed",
    "kept", "slices"}`` (the kept list is rebuilt from the written file, the check ``prune --verify`` prints)."""
    import yaml

    from swapkl.surgery.mergekit import kept_from_config, mergekit_yaml, write_mergekit_yaml

    rem = validate_remove(remove, num_layers)
    text = mergekit_yaml(rem, num_layers, model_ref, dtype, contract)
    path = write_mergekit_yaml(text, out, force=force, inputs=inputs, force_hint=force_hint)
    cfg = yaml.safe_load(Path(path).read_text())
    kept = kept_from_config(cfg)
    if kept != kept_layers(rem, num_layers):  # pragma: no cover - the writer and the reader disagree: a bug
        raise ExportError(f"the written YAML keeps {kept}, not {kept_layers(rem, num_layers)}")
    return {"format": "mergekit", "path": str(path), "removed": rem, "kept": kept, "slices": len(cfg["slices"])}


def export_gguf(src: str | os.PathLike, remove: Iterable[int], out: str | os.PathLike, force: bool = False,
                inputs: Iterable = (), force_hint: str = "--force", zero_units: Iterable = ()) -> dict:
    """Write the pruned GGUF (:func:`swapkl.surgery.gguf_prune.prune_gguf`); the result also carries
    ``llama_quantize``, the same removal as a ``llama-quantize --prune-layers`` command line."""
    from swapkl.surgery.gguf_prune import llama_quantize_command, prune_gguf

    rep = prune_gguf(src, remove, out, force=force, inputs=inputs, force_hint=force_hint, zero_units=zero_units)
    rep.update(format="gguf", llama_quantize=llama_quantize_command(src, rep["removed"], rep["path"]))
    return rep


def export_removal(model, remove, out: str | os.PathLike, fmt: str = "hf", tokenizer=None, identity: dict | None = None,
                   force: bool = False, merge=None, provenance: dict | None = None,
                   force_hint: str = "force=True (prune --force)", model_ref: str | None = None) -> dict:
    """Export ``model`` (a loaded model, e.g. the dashboard's cached one; never changed) with ``remove`` deleted,
    in format ``fmt``.  ``provenance``: ``{"chosen_by": ..., "measured_on": ...}`` for the YAML header;
    ``model_ref``: the source the YAML names (default :func:`mergekit_model_ref`; a demo server names no path of
    its own).  Returns
    ``{"format", "path", "removed", ...}``; raises :class:`ExportError`, ``PruneError``, ``OutputPathError``."""
    check_format(fmt, merge)
    from swapkl.model import architectures as arch  # deferred: torch
    from swapkl.surgery.prune import read_prune_record, save_pruned, source_folders

    n = arch.locate(model).num_layers
    protected = source_folders(model, identity)
    if fmt == "hf":
        path = save_pruned(model, None if merge else remove, out, tokenizer=tokenizer, identity=identity, force=force,
                           merge=merge)
        rec = read_prune_record(path) or {}
        return {"format": "hf", "path": str(path), "removed": rec.get("removed"), "kept": rec.get("kept")}
    if fmt == "gguf":
        return export_gguf(require_gguf_source(identity), remove, out, force=force, inputs=protected,
                           force_hint=force_hint)
    folder = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
    dtype = (identity or {}).get("dtype") or str(next(model.parameters()).dtype).removeprefix("torch.")
    return export_mergekit(remove, n, model_ref or mergekit_model_ref(identity, folder), out, dtype,
                           contract_header(identity, provenance), force=force, inputs=protected, force_hint=force_hint)
