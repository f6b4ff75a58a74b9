"""The two definitions of "block j in slot i" (docs/method.md §1), one class each, found by name in :data:`DEFINITIONS`.

* :class:`SlotDefinition` (``slot``, the paper's and the default): slot i's own module runs with block j's weights
  (``torch.func.functional_call``, the same as copying them in) and with slot i's call, so the moved block gets the
  slot's per-layer settings (rotary or none, attention type, window, layer-index constants).  Defined only where the
  two share a structure: the same state-dict names and shapes (of the unit moved); a pair of a dense and an MoE
  block, an attention and a state-space block, or two head sizes is undefined, with the reason.
* :class:`BlockDefinition` (``block``): block j's own module runs in slot i with block j's own call, everything the
  model gives block j at its own position (its mask, window, rotary table, per-layer inputs): what removal does.
  A state handed on from block to block (:mod:`swapkl.model.handed`) is never block j's own: under both definitions
  a slot gets what the block run in the slot before it handed on.  Defined for every pair, except a block that needs
  such a state in slot 0, where none is handed on (:meth:`~swapkl.scoring.slots.BlockRunner.cannot_start`).  For a sublayer unit, slot i's block runs with block j's unit modules in place of its own,
  with the call of the block whose attention runs (block j's for the attention unit, slot i's for the MLP unit).

Both are exact; on a stack whose layers all have the same settings they give the same numbers.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from swapkl.contract import BLOCK, PER_LAYER, SLOT, SUBLAYERS, check_per_layer

#: the sublayer unit that carries a block's per-layer call (masks, rotary tables): its attention
CALL_UNIT = SUBLAYERS[0]


@dataclass(frozen=True)
class Placement:
    """What runs when a slot takes a block's unit, as data the runner executes: block ``module``'s module (on its
    device), with block ``hybrid_of``'s sublayer-unit modules in place of its own when set, block ``weights_of``'s
    unit weights when set (``torch.func.functional_call``: the same as copying them in), and the call the model's
    forward gave block ``caller``."""

    module: int
    caller: int
    weights_of: int | None = None
    hybrid_of: int | None = None


class PerLayerDefinition:
    """Which module, weights and call run when slot ``slot`` takes block ``block``'s ``unit`` (:class:`Placement`),
    and whether the move is defined; the definition sees indices and structures, never the runner."""

    name: str = ""
    summary: str = ""

    def undefined(self, structure_of: Callable[[int], dict], slot: int, block: int, unit: str) -> str | None:
        """None when the move is defined, else the reason (one line); ``structure_of(k)``: block k's unit structure
        (``{name: (shape, dtype)}``, :func:`structure`)."""
        return None

    def placement(self, slot: int, block: int, unit: str) -> Placement:
        raise NotImplementedError


class SlotDefinition(PerLayerDefinition):
    name = SLOT
    summary = "block j's weights in slot i's module, with the slot's per-layer settings (the paper's)"

    def undefined(self, structure_of, slot, block, unit):
        return structure_difference(structure_of(slot), structure_of(block), slot, block, unit)

    def placement(self, slot, block, unit):
        return Placement(module=slot, caller=slot, weights_of=None if block == slot else block)


class BlockDefinition(PerLayerDefinition):
    name = "block"
    summary = "block j's own module in slot i, with its own per-layer settings (what removal does)"

    def placement(self, slot, block, unit):
        if block == slot or unit == BLOCK:
            return Placement(module=block, caller=block)
        return Placement(module=slot, caller=block if unit == CALL_UNIT else slot, hybrid_of=block)


#: the definitions by name (the names are :data:`swapkl.contract.PER_LAYER`)
DEFINITIONS: dict[str, PerLayerDefinition] = {d.name: d for d in (SlotDefinition(), BlockDefinition())}
assert tuple(DEFINITIONS) == PER_LAYER


def definition(name: str) -> PerLayerDefinition:
    """The definition called ``name`` (raises the contract's one-line error for another name)."""
    return DEFINITIONS[check_per_layer(name)]


def structure(weights: dict, keys=None) -> dict:
    """``{name: (shape, dtype)}`` of a state dict's entries (those in ``keys`` when given)."""
    return {k: (tuple(t.shape), t.dtype) for k, t in weights.items() if keys is None or k in keys}


def structure_difference(a: dict, b: dict, slot: int, block: int, unit: str) -> str | None:
    """None when structures ``a`` (slot's) and ``b`` (block's) are the same, else why block ``block``'s ``unit``
    cannot run in slot ``slot``'s module."""
    what = "blocks" if unit == BLOCK else f"{unit} units"
    if a.keys() != b.keys():
        only = sorted(set(a) ^ set(b))
        return (f"the {what} of layers {slot} and {block} differ in structure ({len(only)} weights in one only, e.g. "
                f"{only[0]}): block {block}'s weights do not fit slot {slot}'s module (use --per-layer block)")
    for k in a:
        if a[k] != b[k]:
            return (f"the {what} of layers {slot} and {block} differ in shape ({k}: {list(a[k][0])} vs {list(b[k][0])})"
                    f": block {block}'s weights do not fit slot {slot}'s module (use --per-layer block)")
    return None


def hybrid_block(own: torch.nn.Module, other: torch.nn.Module, modules) -> torch.nn.Module:
    """A copy of block ``own`` whose child modules ``modules`` (dotted paths: a sublayer unit) are ``other``'s own
    module objects; every other module and every tensor stays shared with ``own`` (module objects copied, never
    weights)."""
    new = copy.copy(own)
    new._modules = dict(own._modules)
    for path in modules:
        parent, theirs = new, other
        parts = path.split(".")
        for part in parts[:-1]:
            child = copy.copy(parent._modules[part])
            child._modules = dict(child._modules)
            parent._modules[part] = child
            parent, theirs = child, theirs._modules[part]
        parent._modules[parts[-1]] = theirs._modules[parts[-1]]
    return new

