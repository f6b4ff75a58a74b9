"""Layer removal that is correct in Hugging Face transformers, without touching the caller's model.

:func:`pruned_copy` builds a *new module tree* over the *same parameter tensors*: every ``nn.Module`` object of
the input is shallow-copied (its own ``__dict__``, its own ``_modules`` / ``_parameters`` / ``_buffers`` / hook
dicts), parameters and buffers are shared, the copied block list keeps only the surviving blocks, each kept
block's attention gets its new ``layer_idx`` (0..L'-1 in order), and the copy gets its own config cut with
:func:`swapkl.architectures.keep_layers_in_config` (``num_hidden_layers`` and per-layer lists such as
``layer_types``).  The input model, its config, its hooks and its ``layer_idx`` values are never changed, so a
model shared between callers (a dashboard's cached model, another thread) stays valid.  Memory cost: module
objects only (kilobytes), no weight copies.

Caveat: the tensors *are* shared, so an in-place write to a parameter of the copy (``p.mul_``) changes the
original as well.  Hooks registered on the copy do not reach the original (and vice versa for hooks
registered after the copy was made).

:func:`save_pruned` writes the copy with ``save_pretrained`` (safetensors) plus ``swapkl_prune.json``; the folder
reloads with ``AutoModelForCausalLM.from_pretrained`` and gives the same logits as the in-memory copy.  It never
writes into the source model's folder, and replaces an existing non-empty folder only when forced.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Iterable

import torch

from swapkl import architectures as arch
from swapkl.errors import SwapklError
from swapkl.results import atomic_write_text

PRUNE_FILE = "swapkl_prune.json"


class PruneError(SwapklError):
    """An impossible removal set."""


def validate_remove(remove: Iterable[int], num_layers: int) -> list[int]:
    """Sorted unique layer indices; raises :class:`PruneError` for out-of-range or all-layer removal."""
    try:
        rem = sorted({int(i) for i in remove})
    except (TypeError, ValueError) as e:
        raise PruneError(f"layer indices must be integers ({e})") from e
    bad = [i for i in rem if not 0 <= i < num_layers]
    if bad:
        raise PruneError(f"layer(s) {bad} out of range: the model has layers 0..{num_layers - 1}")
    if len(rem) >= num_layers:
        raise PruneError(f"cannot remove all {num_layers} layers; keep at least one")
    return rem


def _shallow(module: torch.nn.Module, memo: dict, old_cfg, new_cfg) -> torch.nn.Module:
    """A copy of ``module`` and all its submodules that shares parameters and buffers (recursive)."""
    key = id(module)
    if key in memo:
        return memo[key]
    new = module.__class__.__new__(module.__class__)
    memo[key] = new
    d = {}
    for k, v in module.__dict__.items():
        if v is old_cfg:
            v = new_cfg
        elif k == "generation_config" and v is not None:
            v = copy.deepcopy(v)
        elif isinstance(v, dict):  # _modules, _parameters, _buffers, every hook dict (OrderedDict subclasses kept)
            v = copy.copy(v)
        elif isinstance(v, (set, list)):
            v = copy.copy(v)
        d[k] = v
    new.__dict__.update(d)
    for name, child in list(new._modules.items()):
        if child is not None:
            new._modules[name] = _shallow(child, memo, old_cfg, new_cfg)
    return new


def pruned_copy(model: torch.nn.Module, remove: Iterable[int]) -> torch.nn.Module:
    """A model equal to ``model`` with the decoder blocks ``remove`` (0-based slots) deleted.

    The result shares parameter tensors with ``model`` and never mutates it (see the module docstring).  The
    kept blocks are re-numbered ``0..L'-1`` (``layer_idx`` of the block and its attention; GPT-2's
    ``scale_attn_by_inverse_layer_idx`` scaling follows the new slot, as it does after a reload) and the copy's
    config is cut (``num_hidden_layers``/``n_layer``, ``layer_types``).  ``remove=[]`` gives a private module
    tree of the unchanged model (handy for adding hooks safely).  Evaluate with ``use_cache=False``; generation
    with a cache is correct too because the indices are consecutive.
    """
    loc = arch.locate(model)
    fam = loc.family
    rem = validate_remove(remove, loc.num_layers)
    keep = [i for i in range(loc.num_layers) if i not in set(rem)]
    old_cfg = model.config
    new_cfg = copy.deepcopy(old_cfg)
    arch.keep_layers_in_config(new_cfg, fam, keep)
    new = _shallow(model, {}, old_cfg, new_cfg)
    new_blocks = arch.get_path(new, fam.blocks)
    kept = [new_blocks[i] for i in keep]
    # rebuild the (already private) ModuleList's children in order
    new_blocks._modules.clear()
    for pos, block in enumerate(kept):
        new_blocks._modules[str(pos)] = block
    for pos, block in enumerate(kept):
        _renumber(block, fam, pos)
    return new


def _renumber(block: torch.nn.Module, fam: arch.Family, idx: int) -> None:
    for path in fam.layer_idx_attrs:
        parent_path, _, attr = path.rpartition(".")
        parent = arch.get_path(block, parent_path) if parent_path else block
        if parent is None or not hasattr(parent, attr):
            continue
        old = getattr(parent, attr)
        # slot-dependent attention scaling (GPT-2 scale_attn_by_inverse_layer_idx) follows the new slot
        if (getattr(parent, "scale_attn_by_inverse_layer_idx", False) and isinstance(old, int)
                and isinstance(getattr(parent, "scaling", None), float)):
            parent.scaling = parent.scaling * float(old + 1) / float(idx + 1)
    arch.set_layer_index(block, fam, idx)


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
    ones (:func:`swapkl.outputs.write_model_folder`).  Raises :class:`~swapkl.errors.OutputPathError`.

    ``merge``: save a *merged* model instead (:func:`swapkl.merge.merged_copy`): a list of groups of consecutive
    slots (``[[3, 4]]``: blocks 3 and 4 merged into slot 3, block 4 removed) or ``{"groups": [...], "mode":
    "average" | "laco"}``.  ``remove`` may then be None (it is derived: every group member but the lowest) or must
    equal the derived set.  The merge (groups, mode, formula) is recorded in ``swapkl_prune.json``.
    """
    from swapkl.outputs import check_output_dir, write_model_folder

    out = check_output_dir(out_dir, "output folder", force=force, protected=source_folders(model, identity),
                           force_hint="force=True (prune --force)")
    src = identity or _identity_of(model)
    n_src = arch.locate(model).num_layers
    plan = None
    if merge is not None:
        from swapkl.merge import merge_plan, merged_copy

        plan = merge_plan(merge, n_src)
        if remove is not None and validate_remove(remove, n_src) != plan["removed"]:
            raise PruneError(f"remove={sorted(remove)} does not match the merge, which removes {plan['removed']}")
        remove = plan["removed"]
    elif remove is None:
        raise PruneError("give the layers to remove (or a merge)")
    rem = validate_remove(remove, n_src)
    pruned = pruned_copy(model, rem) if plan is None else merged_copy(model, plan["groups"], plan["mode"])
    if getattr(pruned, "hf_quantizer", None) is not None:
        pruned.hf_quantizer.remove_quantization_config(pruned)
    record = {"source": src, "removed": rem, "kept": [i for i in range(n_src) if i not in rem],
              "num_layers_before": n_src, "num_layers_after": n_src - len(rem),
              "tool": "swapkl"}
    if plan is not None:
        record["merge"] = plan
    try:
        from swapkl import __version__
        record["swapkl_version"] = __version__
    except Exception:  # pragma: no cover
        pass

    def write(folder: Path) -> None:
        pruned.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        atomic_write_text(folder / PRUNE_FILE, json.dumps(record, indent=2, default=str))

    return write_model_folder(out, write)


def read_prune_record(folder: str | os.PathLike) -> dict | None:
    """The ``swapkl_prune.json`` of a saved pruned model, or None."""
    p = Path(folder) / PRUNE_FILE
    return json.loads(p.read_text()) if p.is_file() else None
