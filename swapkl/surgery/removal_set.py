"""A removal set checked against a layer count, without torch: what every export (HF folder, mergekit YAML,
pruned GGUF) validates first.  :mod:`swapkl.surgery.blocks` re-exports both names."""
from __future__ import annotations

from collections.abc import Iterable

from swapkl.contract import BLOCK, SUBLAYERS, UNITS, check_unit
from swapkl.errors import SwapklError


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


def kept_layers(remove: Iterable[int], num_layers: int) -> list[int]:
    """The layers that stay (old 0-based indices, in order) after removing ``remove`` (validated)."""
    rem = set(validate_remove(remove, num_layers))
    return [i for i in range(num_layers) if i not in rem]


def kept_ranges(remove: Iterable[int], num_layers: int) -> list[tuple[int, int]]:
    """The kept layers as half-open ranges ``[a, b)`` (0-based, ``b`` exclusive), one per contiguous run:
    removing 3 and 7 of 10 gives ``[(0, 3), (4, 7), (8, 10)]``."""
    out: list[tuple[int, int]] = []
    for i in kept_layers(remove, num_layers):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


class RemovalSet:
    """What to remove: a set of ``(layer, unit)`` with ``unit`` one of ``block``, ``attention``, ``mlp``.

    Removing a block deletes it (today's :func:`swapkl.surgery.blocks.pruned_copy`, unchanged); removing a sublayer
    skips it (the residual stream passes through).  Both sublayers of one layer are that layer's block (exactly, for
    the residual sublayers :mod:`swapkl.model.units` validates), and a sublayer of a removed block is the block, so
    the set is kept in that normal form.  Immutable, hashable, ordered by (layer, unit)."""

    __slots__ = ("items",)

    def __init__(self, items: Iterable[tuple[int, str]] = ()):
        norm: dict[int, set] = {}
        for item in items:
            try:
                layer, unit = int(item[0]), str(item[1])
            except (TypeError, ValueError, IndexError) as e:
                raise PruneError(f"a removal item is (layer, unit) (got {item!r})") from e
            check_unit(unit, PruneError)
            norm.setdefault(layer, set()).add(unit)
        out = set()
        for layer, units in norm.items():
            if BLOCK in units or set(SUBLAYERS) <= units:
                out.add((layer, BLOCK))
            else:
                out.update((layer, u) for u in units)
        object.__setattr__(self, "items", frozenset(out))

    def __setattr__(self, *_):
        raise AttributeError("a RemovalSet is immutable")

    @classmethod
    def of(cls, layers: Iterable[int], unit: str = "block") -> RemovalSet:
        """Every layer of ``layers`` removed as ``unit``."""
        try:
            return cls((int(i), unit) for i in layers)
        except (TypeError, ValueError) as e:
            raise PruneError(f"layer indices must be integers ({e})") from e

    @classmethod
    def from_list(cls, pairs) -> RemovalSet:
        """From :meth:`to_list` (``[[3, "attention"], [7, "block"]]``)."""
        return cls(tuple(p) for p in pairs)

    def to_list(self) -> list[list]:
        return [[layer, unit] for layer, unit in sorted(self.items)]

    def layers(self, unit: str) -> list[int]:
        """The sorted layers removed as ``unit``."""
        return sorted(layer for layer, u in self.items if u == unit)

    @property
    def blocks(self) -> list[int]:
        return self.layers("block")

    @property
    def unit(self) -> str:
        """``block``, ``attention`` or ``mlp`` when every item is of one unit (``block`` when empty), else ``mixed``."""
        units = {u for _, u in self.items}
        return units.pop() if len(units) == 1 else ("block" if not units else "mixed")

    def validate(self, num_layers: int) -> RemovalSet:
        """Self, after the checks of :func:`validate_remove` on its blocks and the range check on every layer."""
        bad = sorted({layer for layer, _ in self.items if not 0 <= layer < num_layers})
        if bad:
            raise PruneError(f"layer(s) {bad} out of range: the model has layers 0..{num_layers - 1}")
        validate_remove(self.blocks, num_layers)
        return self

    def label(self) -> str:
        """``"attention 3, 5; mlp 7"`` (``"blocks 3, 7"``; ``"nothing"`` when empty)."""
        parts = [f"{'blocks' if u == 'block' else u} {', '.join(str(i) for i in self.layers(u))}"
                 for u in UNITS if self.layers(u)]
        return "; ".join(parts) or "nothing"

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(sorted(self.items))

    def __eq__(self, other) -> bool:
        return isinstance(other, RemovalSet) and other.items == self.items

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return f"RemovalSet({self.label()})"


def as_removal_set(remove, unit: str = "block") -> RemovalSet:
    """``remove`` as a :class:`RemovalSet`: itself, or layer indices removed as ``unit``."""
    return remove if isinstance(remove, RemovalSet) else RemovalSet.of(remove, unit)
