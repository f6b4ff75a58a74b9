"""Layer removal that is correct in Hugging Face transformers, without touching the caller's model.

:func:`pruned_copy` (from :mod:`swapkl.surgery.blocks`, re-exported here; its docstring says what is shared and what
is copied) removes blocks from a private module tree over the caller's parameter tensors.

:func:`save_pruned` writes the copy with ``save_pretrained`` (safetensors) plus ``swapkl_prune.json``; the folder
reloads with ``AutoModelForCausalLM.from_pretrained`` and gives the same logits as the in-memory copy.  It never
writes into the source model's folder, and replaces an existing non-empty folder only when forced.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import torch

from swapkl import __version__
from swapkl.model import architectures as arch
from swapkl.surgery.blocks import PruneError, pruned_copy, validate_remove
from swapkl.surgery.merge import merge_plan, merged_copy
from swapkl.surgery.outputs import PRUNE_FILE, check_output_dir, save_model_folder
from swapkl.surgery.reload_form import prepare_export

__all__ = ["PRUNE_FILE", "PruneError", "pruned_copy", "validate_remove", "source_folders", "save_pruned", "read_prune_record"]


def _identity_of(model) -> dict:
    cfg = model.config
    return {"name_or_path": getattr(model, "name_or_path", None) or getattr(cfg, "_name_or_path", None),
            "model_type": getattr(cfg, "model_type", None),
            "num_layers": arch.locate(model).num_layers}


def source_folders(model: torch.nn.Module, identity: dict | None = None) -> list[str]:
    """The folders and files ``model`` was loaded from (its ``name_or_path`` when that is a local path, a local
    or GGUF identity's ``id``): what a pruned copy may never be written into."""
    out = [getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)]
    if identity and identity.get("kind") in ("local", "gguf"):
        out.append(identity.get("id"))
    return [str(p) for p in out if p and Path(str(p)).expanduser().exists()]


def save_pruned(model: torch.nn.Module, remove: Iterable[int] | None, out_dir: str | os.PathLike, tokenizer=None,
                identity: dict | None = None, force: bool = False, merge=None) -> Path:
    """Save ``model`` with blocks ``remove`` deleted to ``out_dir`` (safetensors) and return the folder.

    Writes ``save_pretrained`` output, the tokenizer when given, and ``swapkl_prune.json`` with the source
    identity (``identity`` or what the model knows about itself), the removed and kept layers (old indices)
    and the new layer count.  A model loaded from a GGUF file carries a quantiser that refuses to save; it is
    removed from the *copy* only.  The input model is not changed.

    ``out_dir`` may not be the source folder or inside it (:func:`source_folders`); an existing non-empty
    folder is refused unless ``force``, and then its old weight files are replaced, none left beside the new
    ones (:func:`swapkl.surgery.outputs.write_model_folder`).  Raises :class:`~swapkl.errors.OutputPathError`.

    ``merge``: save a *merged* model instead (:func:`swapkl.surgery.merge.merged_copy`): a list of groups of consecutive
    slots (``[[3, 4]]``: blocks 3 and 4 merged into slot 3, block 4 removed) or ``{"groups": [...], "mode":
    "average" | "laco"}``.  ``remove`` may then be None (it is derived: every group member but the lowest) or must
    equal the derived set.  The merge (groups, mode, formula) is recorded in ``swapkl_prune.json``.

    Before anything is written, the shortened config is checked to rebuild the kept blocks
    (:func:`swapkl.model.config_cut.structure_difference`); a removal the config cannot describe raises
    :class:`PruneError` in one line.  What the reload derives anew is first given to the copy
    (:mod:`swapkl.surgery.reload_form`): a constant a kept block derives from its position, carried into its weights
    where they absorb it exactly, and the declarations of which weights are tied.

    ``remove`` may be a :class:`~swapkl.surgery.removal_set.RemovalSet` with attention / MLP sublayers: they are saved
    as zeroed output projections (:func:`swapkl.surgery.sublayer_export.save_sublayer_pruned`), blocks as here.
    """
    from swapkl.surgery.removal_set import RemovalSet

    if isinstance(remove, RemovalSet) and merge is None:  # a set of (layer, unit): sublayers are zeroed, blocks deleted
        if remove.unit != "block":
            from swapkl.surgery.sublayer_export import save_sublayer_pruned

            return save_sublayer_pruned(model, remove, out_dir, tokenizer, identity, force,
                                        protected=source_folders(model, identity))
        remove = remove.blocks
    out = check_output_dir(out_dir, "output folder", force=force, protected=source_folders(model, identity),
                           force_hint="force=True (prune --force)")
    src = identity or _identity_of(model)
    n_src = arch.locate(model).num_layers
    plan = None
    if merge is not None:
        plan = merge_plan(merge, n_src)
        if remove is not None and validate_remove(remove, n_src) != plan["removed"]:
            raise PruneError(f"remove={sorted(remove)} does not match the merge, which removes {plan['removed']}")
        remove = plan["removed"]
    elif remove is None:
        raise PruneError("give the layers to remove (or a merge)")
    rem = validate_remove(remove, n_src)
    pruned = pruned_copy(model, rem) if plan is None else merged_copy(model, plan["groups"], plan["mode"])
    wrap = prepare_export(model, pruned, rem)
    if getattr(pruned, "hf_quantizer", None) is not None:
        pruned.hf_quantizer.remove_quantization_config(pruned)
    record = {"source": src, "removed": rem, "kept": [i for i in range(n_src) if i not in rem],
              "num_layers_before": n_src, "num_layers_after": n_src - len(rem),
              "tool": "swapkl"}
    if plan is not None:
        record["merge"] = plan
    record["swapkl_version"] = __version__
    return save_model_folder(out, pruned, tokenizer, record, wrap)


def read_prune_record(folder: str | os.PathLike) -> dict | None:
    """The ``swapkl_prune.json`` of a saved pruned model, or None."""
    p = Path(folder) / PRUNE_FILE
    return json.loads(p.read_text()) if p.is_file() else None
