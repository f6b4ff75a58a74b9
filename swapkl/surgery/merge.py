"""Layer merging (LaCo-style): groups of consecutive blocks collapsed into the lowest slot of each group.

A *merge plan* is a list of groups of consecutive slot indices, e.g. ``[[3, 4], [7, 8, 9]]``: the lowest member
of each group (3, 7) keeps its slot and gets merged weights, every other member (4, 8, 9) is removed.  Two merge
formulas, applied to every parameter tensor of the block (same name in every member):

* ``"average"`` (the paper's scripts): ``θ = mean_k θ_{l+k}`` over the group's members;
* ``"laco"`` (LaCo, Yang et al. 2024, "RDSC"): ``θ = θ_l + Σ_{k>=1} (θ_{l+k} − θ_l)``.

Buffers (e.g. a per-block rotary ``inv_freq``) stay the lowest member's.

:func:`merged_copy` builds on :func:`swapkl.surgery.blocks.pruned_copy`: the result is a new module tree that shares every
untouched tensor with the input model; only the merged blocks get new tensors (one block's worth of float memory
per group).  The input model is never changed.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from swapkl.model import architectures as arch
from swapkl.surgery.blocks import pruned_copy
from swapkl.errors import SwapklError

MODES = ("average", "laco")


class MergeError(SwapklError):
    """An impossible merge plan."""


def normalise_groups(groups: Iterable[Sequence[int]], num_layers: int) -> list[list[int]]:
    """Sorted, validated groups: each has >= 2 consecutive in-range slots, groups are disjoint; sorted by their
    lowest slot.  Raises :class:`MergeError`."""
    out = []
    seen: set[int] = set()
    for g in groups:
        try:
            g = sorted({int(i) for i in g})
        except (TypeError, ValueError) as e:
            raise MergeError(f"merge groups must be lists of layer indices ({e})") from e
        if len(g) < 2:
            raise MergeError(f"a merge group needs at least two layers (got {g})")
        if g != list(range(g[0], g[-1] + 1)):
            raise MergeError(f"a merge group must be consecutive layers (got {g})")
        bad = [i for i in g if not 0 <= i < num_layers]
        if bad:
            raise MergeError(f"layer(s) {bad} out of range: the model has layers 0..{num_layers - 1}")
        if seen & set(g):
            raise MergeError(f"merge groups overlap at layer(s) {sorted(seen & set(g))}")
        seen |= set(g)
        out.append(g)
    if not out:
        raise MergeError("a merge needs at least one group")
    out.sort()
    # two touching groups ([3, 4], [5, 6]) are two merges, which is fine; a group spanning all layers is not
    if sum(len(g) - 1 for g in out) >= num_layers:
        raise MergeError(f"cannot merge all {num_layers} layers away")
    return out


def groups_from_pairs(pairs: Iterable[Sequence[int]]) -> list[list[int]]:
    """Adjacent pairs ``(l, l+1)`` → groups of runs: ``[(3, 4), (4, 5), (8, 9)]`` → ``[[3, 4, 5], [8, 9]]``."""
    members = sorted({int(i) for p in pairs for i in p})
    edges = {(min(p), max(p)) for p in pairs}
    groups: list[list[int]] = []
    for i in members:
        if groups and (groups[-1][-1], i) in edges:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [g for g in groups if len(g) > 1]


def merge_plan(merge, num_layers: int) -> dict:
    """``merge`` (list of groups, or ``{"groups": [...], "mode": ...}``) → ``{"groups", "mode", "removed",
    "formula"}`` (JSON-able; what ``swapkl_prune.json`` records).  Raises :class:`MergeError`."""
    mode = "average"
    groups = merge
    if isinstance(merge, dict):
        groups = merge.get("groups")
        mode = merge.get("mode", "average")
        if groups is None:
            raise MergeError("a merge needs 'groups'")
    if mode not in MODES:
        raise MergeError(f"unknown merge mode '{mode}'; use one of {', '.join(MODES)}")
    g = normalise_groups(groups, num_layers)
    removed = sorted(i for grp in g for i in grp[1:])
    formula = ("theta = mean over the group's blocks" if mode == "average"
               else "theta = theta_l + sum_k (theta_{l+k} - theta_l)")
    return {"groups": g, "mode": mode, "removed": removed, "formula": formula}


def merge_tensors(tensors: Sequence[torch.Tensor], mode: str) -> torch.Tensor:
    """One merged tensor from the group's tensors (lowest slot first), computed in float32 and cast back."""
    base = tensors[0]
    xs = [t.detach().to(torch.float32) for t in tensors]
    if mode == "average":
        out = torch.stack(xs).mean(0)
    elif mode == "laco":
        out = xs[0] + sum(x - xs[0] for x in xs[1:])
    else:
        raise MergeError(f"unknown merge mode '{mode}'")
    return out.to(base.dtype)


def merged_copy(model: torch.nn.Module, groups: Iterable[Sequence[int]], mode: str = "average") -> torch.nn.Module:
    """A model equal to ``model`` with each group of consecutive blocks merged into its lowest slot (see the
    module docstring).  Untouched parameters are shared with ``model`` (no copy); each merged block gets new
    parameter tensors (``requires_grad=False``).  The kept blocks are re-numbered like :func:`pruned_copy`.
    Evaluate with ``use_cache=False``."""
    loc = arch.locate(model)
    plan = merge_plan({"groups": [list(g) for g in groups], "mode": mode}, loc.num_layers)
    keep = [i for i in range(loc.num_layers) if i not in set(plan["removed"])]
    new = pruned_copy(model, plan["removed"])
    new_blocks = arch.locate(new).blocks
    src_blocks = loc.blocks
    for g in plan["groups"]:
        target = new_blocks[keep.index(g[0])]
        members = [src_blocks[i] for i in g]
        for mod_name, mod in target.named_modules():
            for pname, p in list(mod._parameters.items()):
                if p is None:
                    continue
                full = f"{mod_name}.{pname}" if mod_name else pname
                tensors = [m.get_parameter(full) for m in members]
                if any(t.shape != p.shape for t in tensors):
                    raise MergeError(f"cannot merge blocks {g}: parameter {full} differs in shape")
                mod._parameters[pname] = torch.nn.Parameter(merge_tensors(tensors, plan["mode"]),
                                                            requires_grad=False)
    return new
