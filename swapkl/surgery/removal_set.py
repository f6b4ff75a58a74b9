"""A removal set checked against a layer count, without torch: what every export (HF folder, mergekit YAML,
pruned GGUF) validates first.  :mod:`swapkl.surgery.blocks` re-exports both names."""
from __future__ import annotations

from collections.abc import Iterable

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
