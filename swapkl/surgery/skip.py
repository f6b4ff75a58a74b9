"""Removing sublayer units: the skipping runtime and the zeroed-projection form an export saves.

A removed sublayer (attention or MLP, :mod:`swapkl.model.units`) is *skipped*: the residual stream passes through
it unchanged.  Two forms compute exactly that:

* :func:`skipping_copy` (for speed): the unit's core module is replaced, in a private module tree
  (:func:`swapkl.surgery.blocks.pruned_copy`, shared tensors), by :class:`SkippedSublayer`, which returns zeros
  of the core's output shape without computing anything, and the unit's norms by ``nn.Identity`` (they only feed
  or follow the core; a norm of zeros is zero), so the unit's parameters are gone from the model.  A skipped attention keeps no KV cache: the kept
  attentions are renumbered ``0..A-1`` for the cache (so a cache holds one layer per *kept* attention), with
  GPT-2's slot-dependent scaling kept as it was;
* :func:`zeroed_copy` (for exports): the unit's output projection weight and bias are zero (new zero tensors in
  the private tree; the caller's tensors are untouched).  Stock runtimes load and run it with no custom code, but
  they still compute the zeroed sublayer, so only the skipping form gains speed and KV-cache memory.

Both take a :class:`~swapkl.surgery.removal_set.RemovalSet` (or layer indices and a unit); its blocks are deleted as
:func:`~swapkl.surgery.blocks.pruned_copy` deletes them (block removal is unchanged, bit for bit).
"""
from __future__ import annotations

import torch

from swapkl.model import architectures as arch
from swapkl.model.layouts import out_tensors
from swapkl.model.projections import out_width
from swapkl.model.units import layout_for
from swapkl.surgery.blocks import pruned_copy
from swapkl.surgery.removal_set import as_removal_set

__all__ = ["SkippedSublayer", "skipping_copy", "zeroed_copy", "removed_copy"]


class SkippedSublayer(torch.nn.Module):
    """Stands in for a removed sublayer's core module: zeros of shape ``(*input.shape[:-1], out_dim)`` in the
    input's dtype and device, as a ``(zeros, None)`` tuple when the core returned a tuple (attention)."""

    def __init__(self, out_dim: int, returns_tuple: bool, unit: str):
        super().__init__()
        self.out_dim, self.returns_tuple, self.unit = int(out_dim), bool(returns_tuple), unit

    def forward(self, *args, **kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        if x is None:
            x = next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
        z = x.new_zeros(*x.shape[:-1], self.out_dim)
        return (z, None) if self.returns_tuple else z

    def extra_repr(self) -> str:
        return f"skipped {self.unit}, out_dim={self.out_dim}"


def _sublayers(model, removal, unit):
    """(the private pruned copy, the removal set, [(new block, layout spec, unit)] for every removed sublayer,
    the layout: None when only blocks are removed)."""
    loc = arch.locate(model)
    rs = as_removal_set(removal, unit).validate(loc.num_layers)
    new = pruned_copy(model, rs.blocks)
    subs = [(layer, u) for layer, u in rs if u != "block"]
    if not subs:
        return new, rs, [], None
    layout = layout_for(model, loc)
    kept = [i for i in range(loc.num_layers) if i not in set(rs.blocks)]
    blocks = arch.get_path(new, loc.family.blocks)
    return new, rs, [(blocks[kept.index(layer)], layout.spec(u), u) for layer, u in subs], layout


def skipping_copy(model: torch.nn.Module, removal, unit: str = "block") -> torch.nn.Module:
    """A model equal to ``model`` with ``removal`` removed: blocks deleted, sublayers skipped (their core module
    replaced by :class:`SkippedSublayer`; see the module docstring).  ``model`` is never changed."""
    new, rs, subs, layout = _sublayers(model, removal, unit)
    for block, spec, u in subs:
        last = arch.get_path(block, spec.out[-1])
        width = out_width(last) if isinstance(last, torch.nn.Module) else int(model.config.get_text_config().hidden_size)
        _put(block, spec.core, SkippedSublayer(width, returns_tuple=(u == "attention"), unit=u))
        for path in spec.modules:  # the unit's own norms only feed (or follow) its core: nothing left to compute
            if path != spec.core and not path.startswith(spec.core + ".") and path not in spec.shared:
                _put(block, path, torch.nn.Identity())
    if any(u == "attention" for _, _, u in subs):
        _renumber_attention(new, layout.attention.core)
    return new


def _put(block: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    """Replace the child at ``path`` of a (private) block by ``module``."""
    parent_path, _, attr = path.rpartition(".")
    parent = arch.get_path(block, parent_path) if parent_path else block
    parent._modules[attr] = module


def _renumber_attention(model, core: str) -> None:
    """Kept attentions get consecutive cache indices ``0..A-1`` (a skipped attention holds no cache), their
    slot-dependent scaling (GPT-2's ``scale_attn_by_inverse_layer_idx``) kept as it was."""
    loc = arch.locate(model)
    paths = [p for p in loc.family.layer_idx_attrs if p.startswith(core + ".")]
    pos = 0
    for block in loc.blocks:
        att = arch.get_path(block, core)
        if isinstance(att, SkippedSublayer) or att is None:
            continue
        for path in paths:
            attr = path[len(core) + 1:]
            old = getattr(att, attr, None)
            if not isinstance(old, int) or old == pos:
                continue
            if (getattr(att, "scale_attn_by_inverse_layer_idx", False)
                    and isinstance(getattr(att, "scaling", None), float)):
                att.scaling = att.scaling * float(pos + 1) / float(old + 1)
            setattr(att, attr, pos)
        pos += 1


def zeroed_copy(model: torch.nn.Module, removal, unit: str = "block") -> torch.nn.Module:
    """A model equal to ``model`` with ``removal`` removed: blocks deleted, each removed sublayer's output
    projection weight and bias replaced by zeros (new tensors in a private module tree; ``model`` unchanged).
    What a sublayer export saves: stock runtimes load it, and still compute the zeroed sublayer."""
    new, _, subs, _ = _sublayers(model, removal, unit)
    for block, spec, _u in subs:
        for path in spec.out:
            for mod, name in out_tensors(block, path):
                mod._parameters[name] = torch.nn.Parameter(torch.zeros_like(mod._parameters[name]), requires_grad=False)
    return new


def removed_copy(model: torch.nn.Module, removal, unit: str = "block") -> torch.nn.Module:
    """The model to evaluate without ``removal``: :func:`~swapkl.surgery.blocks.pruned_copy` for blocks (today's
    path, unchanged), :func:`skipping_copy` when sublayers are removed."""
    rs = as_removal_set(removal, unit)
    if rs.unit == "block":
        return pruned_copy(model, rs.blocks)
    return skipping_copy(model, rs)
