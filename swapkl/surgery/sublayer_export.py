"""Saving a model with attention / MLP sublayers removed as a Hugging Face folder that stock ``transformers`` loads
with no custom code: each removed sublayer's output projection weight and bias are zero
(:func:`swapkl.surgery.skip.zeroed_copy`), which for these residual sublayers is exactly skipping it; removed blocks
are deleted as in :func:`swapkl.surgery.prune.save_pruned`.

A stock runtime still *computes* a zeroed sublayer (and keeps its KV cache), so the folder is as fast and as large
in memory as the unpruned model apart from deleted blocks; the speed and KV-cache gain needs a runtime that skips
the sublayer (:func:`swapkl.surgery.skip.skipping_copy`, measured by :mod:`swapkl.measure.gains`)."""
from __future__ import annotations

import os
from pathlib import Path

from swapkl import __version__
from swapkl.model import architectures as arch
from swapkl.surgery.outputs import check_output_dir, save_model_folder
from swapkl.surgery.reload_form import prepare_export
from swapkl.surgery.removal_set import RemovalSet

#: said by the CLI and recorded in the folder's swapkl_prune.json
RUNTIME_NOTE = ("removed sublayers are stored as zeroed output projections: stock runtimes (transformers, "
                "llama.cpp, vLLM) still compute them, so this folder is not faster and keeps their KV cache; the "
                "speed and memory gain needs a runtime that skips them (swapkl's skipping runtime)")


def save_sublayer_pruned(model, removal: RemovalSet, out_dir: str | os.PathLike, tokenizer=None,
                         identity: dict | None = None, force: bool = False, protected=()) -> Path:
    """Save ``model`` without ``removal`` (blocks deleted, sublayers' output projections zeroed) to ``out_dir`` and
    return the folder; ``swapkl_prune.json`` records the removed ``(layer, unit)`` items (old layer indices), the
    zeroed tensors and :data:`RUNTIME_NOTE`.  The input model is not changed.  Output path rules as
    :func:`swapkl.surgery.prune.save_pruned` (``protected``: the source folders)."""
    from swapkl.model.units import layout_for
    from swapkl.surgery.skip import zeroed_copy

    out = check_output_dir(out_dir, "output folder", force=force, protected=list(protected),
                           force_hint="force=True (prune --force)")
    loc = arch.locate(model)
    n_src = loc.num_layers
    rs = removal.validate(n_src)
    pruned = zeroed_copy(model, rs)
    wrap = prepare_export(model, pruned, rs.blocks)
    if getattr(pruned, "hf_quantizer", None) is not None:
        pruned.hf_quantizer.remove_quantization_config(pruned)
    layout = layout_for(model, loc) if rs.unit != "block" else None
    zeroed = [f"{loc.family.blocks}.{layer}.{path}" for layer, u in rs if u != "block"
              for path in layout.spec(u).out]
    blocks = rs.blocks
    record = {"source": identity or {"name_or_path": getattr(model, "name_or_path", None),
                                     "model_type": getattr(model.config, "model_type", None), "num_layers": n_src},
              "removed": blocks, "removed_units": rs.to_list(), "zeroed_projections_before_block_removal": zeroed,
              "kept": [i for i in range(n_src) if i not in blocks], "num_layers_before": n_src,
              "num_layers_after": n_src - len(blocks), "runtime_note": RUNTIME_NOTE, "tool": "swapkl",
              "swapkl_version": __version__}
    return save_model_folder(out, pruned, tokenizer, record, wrap)
