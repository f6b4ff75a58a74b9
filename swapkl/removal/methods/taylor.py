"""Taylor importance (first-order): ``I_b = Σ_{θ in block b} |∂L/∂θ · θ|`` (elementwise product, absolute value,
summed over every parameter element of the block), lowest removed first (docs/method.md §5, optional baselines).

``L`` is the mean next-token cross-entropy (nats per token) over the calibration text (the corpus's prompt region,
never the test text), cut into non-overlapping windows; the gradient of the mean over all scored tokens is
accumulated window batch by window batch.  The model runs in eval mode (no dropout), so the result is
deterministic.  Gradients never touch the caller's model: the forward is a :func:`torch.func.functional_call`
with *detached aliases* of the parameters (same storage, their own ``requires_grad``), and the gradients come
from :func:`torch.autograd.grad`, so no ``.grad`` is written and no ``requires_grad`` flag of the shared model
changes.  Literature default: every layer a candidate, no spacing (``params["taylor"] = {"constrained": True}``
applies the rule's).
"""
from __future__ import annotations

import numpy as np
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens
from swapkl.removal.selection import nested, scan

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "taylor", "run": "taylor",
     "description": "Taylor importance: lowest sum over the block of |dL/dθ · θ| (calibration text) first",
     "label": "Taylor", "rule_candidates": False, "offered": True, "order": 8, "calibration": 1024},
]


def taylor_importance(model, ids: torch.Tensor, window: int = 512, batch_size: int = 4) -> np.ndarray:
    """(L,) float64: ``Σ |g ⊙ θ|`` per block, g = ∂(mean token NLL over ``ids``)/∂θ.

    ``ids``: 1-D LongTensor of calibration tokens, cut into non-overlapping windows of ``window`` tokens (a
    shorter tail is dropped unless it is the only window).  Costs one forward + backward per window batch."""
    import torch  # deferred: the registry is imported by --help and the dashboard's first paint
    from torch.func import functional_call

    from swapkl.model import architectures as arch

    loc = arch.locate(model)
    L = loc.num_layers
    prefix = loc.family.blocks  # e.g. "model.layers"
    named = dict(model.named_parameters())  # tied tensors once (functional_call ties them again)
    block_of: dict[str, int] = {}
    for name in named:
        if name.startswith(prefix + "."):
            rest = name[len(prefix) + 1:]
            k = rest.split(".", 1)[0]
            if k.isdigit():
                block_of[name] = int(k)
    # detached aliases: same storage, own autograd flag; the shared model's tensors are never flagged
    params = {n: p.detach() for n, p in named.items()}
    leaf = {n: params[n].requires_grad_(True) for n in block_of}
    buffers = dict(model.named_buffers())
    dev = next(model.parameters()).device
    ids = torch.as_tensor(ids).reshape(-1).long()
    win = max(2, min(int(window), ids.numel()))
    chunks = [ids[s:s + win] for s in range(0, ids.numel() - win + 1, win)] or [ids]
    n_targets = sum(c.numel() - 1 for c in chunks)
    grads = {n: torch.zeros_like(t, dtype=torch.float32) for n, t in leaf.items()}
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            for s in range(0, len(chunks), batch_size):
                x = torch.stack(chunks[s:s + batch_size]).to(dev)
                out = functional_call(model, ({**params, **leaf}, buffers), args=(),
                                      kwargs={"input_ids": x, "use_cache": False})
                logits = (out.logits if hasattr(out, "logits") else out[0])[:, :-1].float()
                nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                        x[:, 1:].reshape(-1), reduction="sum") / n_targets
                names = list(leaf)
                gs = torch.autograd.grad(nll, [leaf[n] for n in names], allow_unused=True)
                for n, g in zip(names, gs):
                    if g is not None:
                        grads[n] += g.float()
    finally:
        if was_training:
            model.train()
    out = np.zeros(L)
    for n, k in block_of.items():
        out[k] += float((grads[n] * leaf[n].detach().float()).abs().double().sum())
    return out


def taylor(ctx, budget):
    max_tokens = calib_tokens(ctx, "taylor")
    ids = ctx.calib_ids(max_tokens)
    scores = taylor_importance(ctx.model, ids, window=ctx.evaluator.window)
    cands, spacing, settings = ctx.literature_candidates("taylor", budget)
    picks = scan(sorted(cands, key=lambda i: (scores[i], i)), budget, spacing)
    out = MethodOutput(sets=nested(picks), info={"taylor": scores.tolist(), "calib_tokens": int(ids.numel())},
                       settings=settings | {"calib_tokens": int(ids.numel()), "window": ctx.evaluator.window,
                                            "importance": "sum over block parameters of |dL/dtheta * theta|, "
                                                          "L = mean token NLL (nats), eval mode",
                                            "calibration": "corpus prompt region (disjoint from the test text)"})
    if len(picks) < budget:
        out.notes.append(f"taylor order stops after {len(picks)} layers under spacing Δ={spacing}")
    return out
