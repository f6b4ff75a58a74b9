"""How many parameters a removal set removes: the per-layer parameter counts of blocks and of their attention /
MLP sublayer units, and the model's non-embedding total (every block plus the final norm; the embeddings and the
output head are not counted), the common x axis on which block, attention and MLP removal compare.

:func:`unit_sizes` reads a loaded model (torch, deferred); :func:`params_removed` is plain arithmetic on its result,
so a curves file carries the sizes and a figure needs no model."""
from __future__ import annotations

from swapkl.surgery.removal_set import as_removal_set


def unit_sizes(model) -> dict:
    """``{"non_embedding": N, "block": [per layer], "attention": [...], "mlp": [...]}`` (parameter counts; the
    sublayer lists are None for a family without validated sublayer units).  A sublayer counts only the
    parameters that removing it drops in a skipping runtime (its modules, norms included)."""
    from swapkl.model import architectures as arch  # deferred: pulls torch
    from swapkl.model.units import SUBLAYERS, UnsupportedUnit, layout_for, unit_keys

    loc = arch.locate(model)
    block = [sum(p.numel() for p in b.parameters()) for b in loc.blocks]
    norm = sum(p.numel() for p in loc.final_norm.parameters()) if loc.final_norm is not None else 0
    out = {"non_embedding": int(sum(block) + norm), "block": [int(x) for x in block]}
    try:
        layout = layout_for(model, loc)
    except UnsupportedUnit:
        layout = None
    for unit in SUBLAYERS:
        if layout is None:
            out[unit] = None
            continue
        counts = []
        for b in loc.blocks:
            params = dict(b.named_parameters())
            keys = unit_keys(b, layout, unit)
            counts.append(int(sum(p.numel() for k, p in params.items() if k in keys)))
        out[unit] = counts
    return out


def params_removed(sizes: dict, removal, unit: str = "block") -> int:
    """The parameters ``removal`` (a :class:`~swapkl.surgery.removal_set.RemovalSet`, or layers of ``unit``)
    removes, from :func:`unit_sizes`."""
    total = 0
    for layer, u in as_removal_set(removal, unit):
        counts = sizes.get(u)
        if counts is None:
            raise ValueError(f"no {u} sizes for this model")
        total += int(counts[layer])
    return total
