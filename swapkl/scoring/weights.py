"""The weights a block runner moves between slots, in one small object: each block's weights as ``load_state_dict``
would copy them (parameters and persistent buffers), a block's weights on another device (a model a device map
spreads), a slot's weights with another block's sublayer unit mixed in, and the structure of a slot's unit.  Tensors
are referenced, never copied, unless a device map makes a copy necessary."""
from __future__ import annotations

from collections import OrderedDict

from swapkl.errors import ModelLoadError
from swapkl.model.units import mixed_weights
from swapkl.scoring.definitions import structure

#: copies of a block's weights on another device kept at once
MOVED_KEPT = 4


class UnitWeights:
    """``weights[k]``: block k's ``{name: tensor}``; ``unit_keys[k]``: the state-dict names of block k's unit (None
    for whole blocks: every entry moves).  A block offloaded to the meta device is refused in one line."""

    def __init__(self, blocks, unit_keys: list | None = None):
        self.weights = [dict(b.state_dict(keep_vars=True)) for b in blocks]
        for s, w in enumerate(self.weights):
            if any(t.device.type == "meta" for t in w.values()):
                raise ModelLoadError(
                    f"layer {s} is offloaded (its weights are on the 'meta' device: device_map put it on cpu/disk "
                    "offload); swapkl needs every layer resident on a device: use more GPUs, --dtype bfloat16, "
                    "or a device_map without cpu/disk offload")
        self.unit_keys = unit_keys
        self._moved: OrderedDict = OrderedDict()  # (block, device) -> weights copied there (multi-device maps)
        self._mixed: dict = {}  # (slot, block, device) -> a slot's weights with another block's unit (references)
        self._structures: dict = {}

    def on(self, block: int, dev) -> dict:
        """Block ``block``'s weights on ``dev``: the tensors themselves when they are there already, else a copy;
        the last :data:`MOVED_KEPT` copies are kept."""
        w = self.weights[block]
        if all(t.device == dev for t in w.values()):
            return w
        key = (block, str(dev))
        if key in self._moved:
            self._moved.move_to_end(key)
            return self._moved[key]
        moved = {k: t.to(dev) for k, t in w.items()}
        self._moved[key] = moved
        while len(self._moved) > MOVED_KEPT:
            self._moved.popitem(last=False)
        return moved

    def for_slot(self, slot: int, block: int, dev) -> dict:
        """The weights slot ``slot`` runs when it takes block ``block``'s unit: all of block ``block``'s for whole
        blocks, else block ``block``'s unit entries and slot ``slot``'s own for the rest."""
        if self.unit_keys is None:
            return self.on(block, dev)
        key = (slot, block, str(dev))
        if key in self._mixed:
            return self._mixed[key]
        own, other = self.on(slot, dev), self.on(block, dev)
        mixed = mixed_weights(own, other, self.unit_keys[slot])
        if own is self.weights[slot] and other is self.weights[block]:  # references only: kept for the next call
            self._mixed[key] = mixed
        return mixed

    def structure(self, slot: int) -> dict:
        """The structure of slot ``slot``'s unit: ``{name: (shape, dtype)}`` of its weights."""
        if slot not in self._structures:
            keys = None if self.unit_keys is None else self.unit_keys[slot]
            self._structures[slot] = structure(self.weights[slot], keys)
        return self._structures[slot]
