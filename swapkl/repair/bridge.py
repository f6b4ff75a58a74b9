"""A linear bridge and the bridged model (docs/repair.md, docs/method.md "Linear bridge"): the one place a bridge is
*applied* to a model.

A removal set is cut into maximal runs of consecutive blocks, *spans* ``[i, j)``; each span gets one d×d map ``W``
in one of the forms of :mod:`swapkl.repair.forms` (folded into block i−1's MLP output projection, or on the
residual stream in front of block j).  What differs between the forms is the form's code; this module only cuts
sets into spans and builds the bridged model.

:func:`bridged_model` builds the bridged model as a private module tree over the caller's tensors
(:func:`swapkl.surgery.blocks.pruned_copy`): the caller's model is never changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.repair import forms
from swapkl.repair.forms.base import BridgeForm, NoExactFold
from swapkl.repair.forms.folded import fold_target, folded_weights
from swapkl.surgery.blocks import pruned_copy
from swapkl.surgery.removal_set import validate_remove

#: the forms' names (:data:`swapkl.repair.forms.NAMES`)
FORMS = forms.NAMES

__all__ = ["FORMS", "Bridge", "NoExactFold", "bridged_model", "captured_blocks", "start_state", "fold_target", "folded_weights", "new_index",
           "spans_of"]


@dataclass
class Bridge:
    """The bridge of span ``[start, end)`` (0-based blocks of the source model): its ``form`` (a name of
    :mod:`swapkl.repair.forms`), ``W`` [D, D] float64 acting on rows (``y = x W``) and its fit
    (:meth:`swapkl.repair.fit.FitResult.summary`: ε, tokens, residual)."""

    start: int
    end: int
    form: str
    W: np.ndarray
    fit: dict = field(default_factory=dict)

    @property
    def kind(self) -> BridgeForm:
        """The form's behaviour (:class:`~swapkl.repair.forms.BridgeForm`)."""
        return forms.get(self.form)

    def summary(self) -> dict:
        return {"span": [self.start, self.end], "form": self.form, **self.fit}


def spans_of(remove) -> list[tuple[int, int]]:
    """The maximal runs of consecutive layers of ``remove`` as half-open spans: [3, 4, 7] → [(3, 5), (7, 8)]."""
    out: list[list[int]] = []
    for k in sorted(set(int(x) for x in remove)):
        if out and out[-1][1] == k:
            out[-1][1] = k + 1
        else:
            out.append([k, k + 1])
    return [(a, b) for a, b in out]


def new_index(bridges) -> callable:
    """``index(old)``: a source block's index in the model without every bridge's span."""
    gone = {k for b in bridges for k in range(b.start, b.end)}
    return lambda old: old - sum(1 for k in gone if k < old)


def captured_blocks(bridges) -> set[int]:
    """The blocks whose MLP output the bridges' forms read for their start states
    (:meth:`~swapkl.repair.forms.BridgeForm.captures`)."""
    return {k for b in bridges for k in b.kind.captures(b.start)}


def start_state(bridge: Bridge, h, mlp_out: dict):
    """The bridged stream where block ``bridge.end`` starts, from ``h`` (the stream entering block
    ``bridge.start``) and ``mlp_out`` (``{k: block k's MLP output}`` of :func:`captured_blocks`), by the bridge's
    form (:meth:`~swapkl.repair.forms.BridgeForm.start_state`): the one definition, for the sweep and the ground
    truth."""
    W = torch.as_tensor(bridge.W, dtype=torch.float32, device=h.device)
    (m,) = [mlp_out[k] for k in bridge.kind.captures(bridge.start)] or [None]
    return bridge.kind.start_state(h, W, m)


def bridged_model(model: torch.nn.Module, bridges: list[Bridge]) -> torch.nn.Module:
    """``model`` with every bridge's span removed and the bridge in its place (the bridges' spans are disjoint and
    not adjacent), each attached by its form (:meth:`~swapkl.repair.forms.BridgeForm.attach`).  Shares every
    unchanged tensor with ``model``, which is not changed."""
    L = arch.locate(model).num_layers
    removed = validate_remove([k for b in bridges for k in range(b.start, b.end)], L)
    if len(removed) != sum(b.end - b.start for b in bridges):
        raise SwapklError("the bridges' spans overlap")
    new = pruned_copy(model, removed)
    nloc = arch.locate(new)
    index = new_index(bridges)
    for b in bridges:
        kind = b.kind
        kind.check(model, b.start)  # the one-line refusal
        kind.attach(kind.site(nloc, b, index, L), b, nloc)
    return new
