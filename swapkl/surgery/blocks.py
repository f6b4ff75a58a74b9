"""Block removal on a private module tree: correct in Hugging Face transformers, the caller's model untouched.

:func:`pruned_copy` builds a *new module tree* over the *same parameter tensors*: every ``nn.Module`` object of
the input is shallow-copied (its own ``__dict__``, its own ``_modules`` / ``_parameters`` / ``_buffers`` / hook
dicts), parameters and buffers are shared, the copied block list keeps only the surviving blocks, each kept
block's attention gets its new ``layer_idx`` (0..L'-1 in order), and the copy gets its own config cut with
:func:`swapkl.model.config_cut.cut_config` (layer counts, per-layer lists such as ``layer_types``, lists of layer
indices, "first k layers" counts); module attributes that hold layer indices are renumbered alike
(:data:`~swapkl.model.config_cut.INDEX_KEYED_ATTRS`); weights kept per layer outside the blocks (per-layer embeddings) are replaced on the
copy by their kept layers' rows.  The input model, its config, its hooks and its ``layer_idx`` values are never
changed, so a
model shared between callers (a dashboard's cached model, another thread) stays valid.  Memory cost: module
objects only (kilobytes), no weight copies.

Caveat: the tensors *are* shared, so an in-place write to a parameter of the copy (``p.mul_``) changes the
original as well.  Hooks registered on the copy do not reach the original (and vice versa for hooks
registered after the copy was made).

The core of :mod:`swapkl.surgery.prune` (which re-exports it and saves pruned copies) and of :mod:`swapkl.surgery.merge`.
"""
from __future__ import annotations

import copy
import weakref
from typing import Iterable

import torch

from swapkl.model import architectures as arch
from swapkl.model.config_cut import INDEX_KEYED_ATTRS, cut_config, cut_rows, outside_cuts, renumbered
from swapkl.surgery.removal_set import PruneError, validate_remove

__all__ = ["PruneError", "validate_remove", "pruned_copy"]


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
    new_cfg = cut_config(old_cfg, keep, loc.num_layers)
    cuts = _outside(model, loc, keep, new_cfg)
    new = _shallow(model, {}, old_cfg, new_cfg)
    new_blocks = arch.get_path(new, fam.blocks)
    kept = [new_blocks[i] for i in keep]
    # rebuild the (already private) ModuleList's children in order
    new_blocks._modules.clear()
    for pos, block in enumerate(kept):
        new_blocks._modules[str(pos)] = block
    for pos, block in enumerate(kept):
        renumber_layers(block, fam, pos)
    if len(keep) < loc.num_layers:
        for module in new.modules():  # each module once, wherever it sits
            for attr in INDEX_KEYED_ATTRS:
                if attr in vars(module):
                    setattr(module, attr, renumbered(vars(module)[attr], keep))
    _cut_outside(new, cuts, keep)
    return new


_OUTSIDE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {kept layers: (cuts, reason)}


def _outside(model: torch.nn.Module, loc, keep: list[int], config) -> dict:
    """``{name: (dim, group)}``: the weights outside the blocks that a stack of ``keep`` needs cut layer by layer
    (:func:`~swapkl.model.config_cut.outside_cuts`); refuses (one line) a removal that would leave other weights
    outside the blocks wrong.  Memoised per model and kept set (whether a removal is refused can depend on which layers
    it keeps, not only on how many)."""
    if len(keep) == loc.num_layers:
        return {}
    seen = _OUTSIDE.setdefault(model, {})
    key = tuple(keep)
    if key not in seen:
        seen[key] = outside_cuts(model, config, loc.family.blocks, keep, loc.num_layers)
    cuts, why = seen[key]
    if why is not None:
        raise PruneError(f"cannot remove layers from {getattr(model.config, 'model_type', 'this model')}: {why}")
    return cuts


def _cut_outside(new: torch.nn.Module, cuts: dict, keep: list[int]) -> None:
    """On the private copy ``new``: each weight of ``cuts`` replaced by its kept layers' rows (new tensors; the
    caller's weights untouched)."""
    for name, (dim, group) in cuts.items():
        owner_path, _, attr = name.rpartition(".")
        owner = new.get_submodule(owner_path) if owner_path else new
        old = getattr(owner, attr)
        cut = cut_rows(old.detach(), dim, group, keep)
        if attr in owner._parameters:
            owner._parameters[attr] = torch.nn.Parameter(cut, requires_grad=old.requires_grad)
        else:
            owner._buffers[attr] = cut


def renumber_layers(block: torch.nn.Module, fam: arch.Family, idx: int) -> None:
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
