"""The folded bridged model as an ordinary Hugging Face checkpoint (docs/repair.md "Export").

Only the folded form is a checkpoint of the same family (its bridges live in block i−1's MLP output projection);
a residual bridge, a span from block 0 or a family without an exact fold is refused in one line before anything is
written.  The folder holds the ``save_pretrained`` files, the tokenizer, ``swapkl_prune.json`` (the removal record,
with the bridges) and :data:`BRIDGE_FILE`, the provenance: the contract, the set, each bridge's fit (form, tokens,
ε, residual) and the held-out ΔPPL raw and bridged.  Everything is written in one atomic folder replacement.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from swapkl import __version__
from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.repair.bridge import Bridge, bridged_model, fold_target
from swapkl.store import atomic_write_text
from swapkl.surgery.outputs import PRUNE_FILE, write_model_folder

BRIDGE_FILE = "swapkl_bridge.json"
FORMAT = "swapkl.bridge-export/1"


def check_foldable(model, bridges: list[Bridge]) -> None:
    """Raise one line unless every bridge is folded and foldable (nothing is written before this passes)."""
    for b in bridges:
        if b.form != "folded":
            raise SwapklError(f"the bridge of layers {b.start}..{b.end - 1} is in the residual form, which is no "
                              "ordinary checkpoint: export the folded form (--form folded)")
        fold_target(model, b.start)


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
    fits = [b.summary() for b in bridges]
    record = {"source": identity or {}, "removed": removed, "kept": [i for i in range(n) if i not in removed],
              "num_layers_before": n, "num_layers_after": n - len(removed), "tool": "swapkl",
              "repair": {"kind": "bridge", "form": "folded", "bridges": fits}, "swapkl_version": __version__}
    prov = {"format": FORMAT, "removed": removed, "bridges": fits, **(provenance or {}),
            "swapkl_version": __version__}

    def write(folder: Path) -> None:
        bridged.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        atomic_write_text(folder / PRUNE_FILE, json.dumps(record, indent=2, default=str))
        atomic_write_text(folder / BRIDGE_FILE, json.dumps(prov, indent=2, default=str))

    return write_model_folder(out, write)
