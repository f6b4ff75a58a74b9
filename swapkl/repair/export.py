"""The folded bridged model as an ordinary Hugging Face checkpoint or GGUF file (docs/repair.md "Export").

Only the folded form is a checkpoint of the same family (its bridges live in block i−1's MLP output projection);
a residual bridge, a span from block 0 or a family without an exact fold is refused in one line before anything is
written.  The folder holds the ``save_pretrained`` files, the tokenizer, ``swapkl_prune.json`` (the removal record,
with the bridges) and :data:`BRIDGE_FILE`, the provenance: the contract, the set, each bridge's fit (form, tokens,
ε, residual) and the held-out ΔPPL raw and bridged.  Everything is written in one atomic folder replacement.

A GGUF source (the built-in default, a ``.gguf`` file) exports as a GGUF too (:func:`save_bridged_gguf`): the
source's blocks are copied as they are (quantised ones byte for byte, :func:`swapkl.surgery.gguf_prune.prune_gguf`)
except each bridge's folded MLP output projection, written in F32; the provenance goes beside the file
(``OUT.gguf.swapkl_bridge.json``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from swapkl import __version__
from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.model.projections import CONV1D_LAYOUT
from swapkl.repair.bridge import Bridge, bridged_model, fold_target
from swapkl.store import atomic_write_text
from swapkl.surgery.outputs import save_model_folder
from swapkl.surgery.reload_form import prepare_export

BRIDGE_FILE = "swapkl_bridge.json"
FORMAT = "swapkl.bridge-export/1"


def check_foldable(model, bridges: list[Bridge]) -> None:
    """Raise one line unless every bridge's form exports (:meth:`~swapkl.repair.forms.BridgeForm.export_refusal`)
    and applies to its span of ``model`` (nothing is written before this passes)."""
    for b in bridges:
        why = b.kind.export_refusal(b)
        if why:
            raise SwapklError(why)
        b.kind.check(model, b.start)


def save_bridged(model, bridges: list[Bridge], out: str | os.PathLike, tokenizer=None, identity: dict | None = None,
                 provenance: dict | None = None) -> Path:
    """Write the folded bridged model to ``out`` (checked by the caller: :func:`swapkl.surgery.outputs.check_output_dir`)
    with its removal record and :data:`BRIDGE_FILE`; returns the folder."""
    check_foldable(model, bridges)
    bridged = bridged_model(model, bridges)
    if getattr(bridged, "hf_quantizer", None) is not None:
        bridged.hf_quantizer.remove_quantization_config(bridged)
    n = arch.locate(model).num_layers
    removed = sorted(k for b in bridges for k in range(b.start, b.end))
    wrap = prepare_export(model, bridged, removed)
    fits = [b.summary() for b in bridges]
    record = {"source": identity or {}, "removed": removed, "kept": [i for i in range(n) if i not in removed],
              "num_layers_before": n, "num_layers_after": n - len(removed), "tool": "swapkl",
              "repair": {"kind": "bridge", "form": bridges[0].form if bridges else None, "bridges": fits}, "swapkl_version": __version__}
    prov = {"format": FORMAT, "removed": removed, "bridges": fits, **(provenance or {}),
            "swapkl_version": __version__}

    return save_model_folder(out, bridged, tokenizer, record, wrap, {BRIDGE_FILE: prov})


#: llama.cpp's name of a block's MLP output projection, in every family swapkl supports
GGUF_MLP_OUT = "ffn_down"


def gguf_bridge_tensors(model, bridges: list[Bridge]) -> dict:
    """``{GGUF tensor name: float32 array}``: each folded bridge's projection of block ``start − 1`` (weight
    [out, in] as GGUF stores it, whatever the Hugging Face layout; bias when present), named in the *source* file's
    block numbering.  ``model`` is the GGUF source as loaded (its dequantised weights)."""
    check_foldable(model, bridges)
    from swapkl.repair.bridge import folded_weights

    fam = arch.locate(model).family
    out = {}
    for b in bridges:
        for name, t in folded_weights(fold_target(model, b.start), fam.mlp_out_layout, b.W).items():
            a = t.detach().float().cpu().numpy()
            out[f"blk.{b.start - 1}.{GGUF_MLP_OUT}.{name}"] = a.T if name == "weight" and \
                fam.mlp_out_layout == CONV1D_LAYOUT else a
    return out


def gguf_provenance_path(out: str | os.PathLike) -> Path:
    """Where the provenance of a bridged GGUF goes: beside it, ``OUT.gguf.swapkl_bridge.json``."""
    out = Path(out)
    return out.with_name(f"{out.name}.{BRIDGE_FILE}")


def save_bridged_gguf(model, bridges: list[Bridge], src: str | os.PathLike, out: str | os.PathLike, *,
                      force: bool = False, inputs=(), provenance: dict | None = None) -> dict:
    """Write the GGUF ``src`` with the bridges' spans removed and their folded projections in place (the file
    checked by :func:`swapkl.surgery.gguf_prune.prune_gguf`), then its provenance beside it; returns prune_gguf's
    report with ``provenance`` (the sidecar's path) added."""
    from swapkl.surgery.gguf_prune import prune_gguf

    replace = gguf_bridge_tensors(model, bridges)
    removed = sorted(k for b in bridges for k in range(b.start, b.end))
    rep = prune_gguf(src, removed, out, force=force, inputs=inputs, replace=replace)
    fits = [b.summary() for b in bridges]
    prov = {"format": FORMAT, "file": Path(rep["path"]).name, "removed": removed, "bridges": fits,
            "replaced_tensors": rep["replaced"], **(provenance or {}), "swapkl_version": __version__}
    side = gguf_provenance_path(rep["path"])
    atomic_write_text(side, json.dumps(prov, indent=2, default=str))
    return {**rep, "provenance": str(side)}
