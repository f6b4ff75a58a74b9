"""The two forms of a linear bridge and the bridged model (docs/repair.md, docs/method.md "Linear bridge").

A removal set is cut into maximal runs of consecutive blocks, *spans* ``[i, j)``; each span gets one d×d map ``W``:

* **residual** (LinearPatch, Ghosted layers): the residual stream where block i used to start is mapped,
  ``h_j ≈ h_i W``, applied in front of block j (of the final norm when the span runs to the last block);
* **folded** (ReplaceMe, least squares): the output ``m`` of block i−1's MLP (its output projection, before the
  residual add) is mapped, ``h_{i−1} + m W ≈ h_j`` where ``h_{i−1} = h_i − m`` is the stream before that add; so
  ``W`` is folded into the projection (:func:`folded_weights`) and the result is an ordinary checkpoint of the same
  family with fewer blocks.  A span that starts at block 0, a family without a known MLP output projection, or one
  with a norm after it (Gemma's sandwich norms) has no exact fold: :func:`fold_target` says so in one line.

:func:`bridged_model` builds the bridged model as a private module tree over the caller's tensors
(:func:`swapkl.surgery.blocks.pruned_copy`): the caller's model is never changed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.surgery.blocks import pruned_copy
from swapkl.surgery.removal_set import validate_remove

FORMS = ("folded", "residual")


class NoExactFold(SwapklError):
    """The folded form does not apply to this span of this family (the residual form does)."""


@dataclass
class Bridge:
    """The bridge of span ``[start, end)`` (0-based blocks of the source model): ``W`` [D, D] float64 acting on rows
    (``y = x W``) and its fit (:meth:`swapkl.repair.fit.FitResult.summary`: ε, tokens, residual)."""

    start: int
    end: int
    form: str
    W: np.ndarray
    fit: dict = field(default_factory=dict)

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


def check_form(form: str) -> str:
    if form not in FORMS:
        raise SwapklError(f"unknown bridge form '{form}'; choose one of: {', '.join(FORMS)}")
    return form


def check_fold_start(start: int) -> None:
    """Raise :class:`NoExactFold` (one line) for a span that starts at block 0: no MLP before it to fold into."""
    if start == 0:
        raise NoExactFold("the span starts at block 0: there is no MLP before it to fold the bridge into; "
                          "use --form residual")


def fold_target(model: torch.nn.Module, start: int) -> torch.nn.Module:
    """The module the folded form of a span starting at block ``start`` maps: block ``start − 1``'s MLP output
    projection.  Raises :class:`NoExactFold` (one line) where no exact fold exists."""
    check_fold_start(start)
    loc = arch.locate(model)
    fam = loc.family
    if fam.post_mlp_norm:
        raise NoExactFold(f"the {fam.name} family applies a norm ({fam.post_mlp_norm}) after the MLP output "
                          "projection: a linear map cannot be folded into it exactly; use --form residual")
    proj = arch.get_path(loc.blocks[start - 1], fam.mlp_out) if fam.mlp_out else None
    if not isinstance(proj, torch.nn.Module) or getattr(proj, "weight", None) is None:
        what = (f"block {start - 1} of the {fam.name} family has no MLP output projection" if fam.mlp_out else
                f"the {fam.name} family has no MLP output projection whose output is added to the residual stream as "
                "it is (a norm after it, or none under the usual names)")
        raise NoExactFold(f"{what} to fold the bridge into; use --form residual")
    return proj


def folded_weights(proj: torch.nn.Module, layout: str, W: np.ndarray) -> dict[str, torch.Tensor]:
    """The projection's ``weight`` (and ``bias``) with ``W`` folded in, so that ``proj'(x) = proj(x) W``:
    ``linear`` (``y = x Aᵀ + b``): ``A' = Wᵀ A``; ``conv1d`` (``y = x A + b``): ``A' = A W``; ``b' = b W``.  Computed in
    float64, returned in the projection's dtype and device."""
    w = proj.weight.detach()
    T = torch.as_tensor(W, dtype=torch.float64, device=w.device)
    A = w.double()
    out = {"weight": (T.T @ A if layout == "linear" else A @ T).to(w.dtype)}
    b = getattr(proj, "bias", None)
    if b is not None:
        out["bias"] = (b.detach().double() @ T).to(b.dtype)
    return out


def _map_hook(W: torch.Tensor):
    """A forward pre-hook that multiplies the module's hidden-states input by ``W`` (float32; positional or keyword)."""
    def hook(mod, args, kwargs):
        if args:
            return ((args[0].float() @ W).to(args[0].dtype),) + tuple(args[1:]), kwargs
        h = kwargs["hidden_states"]
        return args, {**kwargs, "hidden_states": (h.float() @ W).to(h.dtype)}
    return hook


def bridged_model(model: torch.nn.Module, bridges: list[Bridge]) -> torch.nn.Module:
    """``model`` with every bridge's span removed and the bridge in its place (the bridges' spans are disjoint and
    not adjacent).  Shares every unchanged tensor with ``model``, which is not changed; a folded bridge gives the
    copy's projection new tensors, a residual one a forward pre-hook on the copy's module after the span."""
    loc = arch.locate(model)
    L = loc.num_layers
    removed = validate_remove([k for b in bridges for k in range(b.start, b.end)], L)
    if len(removed) != sum(b.end - b.start for b in bridges):
        raise SwapklError("the bridges' spans overlap")
    new = pruned_copy(model, removed)
    nloc = arch.locate(new)
    fam = nloc.family
    gone = set(removed)

    def new_index(old: int) -> int:
        return old - sum(1 for k in gone if k < old)

    for b in bridges:
        check_form(b.form)
        if b.form == "folded":
            fold_target(model, b.start)  # the one-line refusal
            proj = arch.get_path(nloc.blocks[new_index(b.start - 1)], fam.mlp_out)
            for name, t in folded_weights(proj, fam.mlp_out_layout, b.W).items():
                proj._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
        else:
            target = nloc.final_norm if b.end == L else nloc.blocks[new_index(b.end)]
            dev = next(target.parameters(), next(new.parameters())).device
            W = torch.as_tensor(b.W, dtype=torch.float32, device=dev)
            target.register_forward_pre_hook(_map_hook(W), with_kwargs=True)
    return new
