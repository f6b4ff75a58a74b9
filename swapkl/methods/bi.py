"""Block Influence (ShortGPT): ``BI_i = 1 - mean over tokens of cos(h_in_t, h_out_t)`` of block i.

Per-token cosine between the block's input and output hidden states, read with forward hooks on the blocks of a
private module tree (:func:`swapkl.prune.pruned_copy` with nothing removed, so the caller's model never carries a
hook), on calibration text (the corpus's prompt region, disjoint from the test text).  Lowest BI is removed first.
Literature default: every layer is a candidate and there is no spacing rule (``params["bi"] = {"constrained":
True}`` applies the guided methods' candidates and spacing instead).
"""
from __future__ import annotations

import numpy as np
import torch

from swapkl import architectures as arch
from swapkl.methods import MethodOutput, register
from swapkl.removal import check_budget, nested, scan


def _hidden(x):
    return x[0] if isinstance(x, (tuple, list)) else x


@torch.no_grad()
def block_influence(model, ids: torch.Tensor, window: int = 512, batch_size: int = 4) -> np.ndarray:
    """(L,) float64: BI of every block on ``ids`` (1-D LongTensor) cut into non-overlapping windows."""
    from swapkl.prune import pruned_copy

    priv = pruned_copy(model, [])
    blocks = arch.locate(priv).blocks
    L = len(blocks)
    sums = np.zeros(L)
    count = 0
    inputs: dict[int, torch.Tensor] = {}
    handles = []

    def pre(k):
        def hook(mod, args, kwargs):
            inputs[k] = _hidden(args[0] if args else kwargs["hidden_states"])
        return hook

    def post(k):
        def hook(mod, args, kwargs, out):
            h_in, h_out = inputs.pop(k).float(), _hidden(out).float()
            cos = torch.nn.functional.cosine_similarity(h_in, h_out, dim=-1)  # (B, T): per token
            sums[k] += float(cos.double().sum())
        return hook

    for k, b in enumerate(blocks):
        handles.append(b.register_forward_pre_hook(pre(k), with_kwargs=True))
        handles.append(b.register_forward_hook(post(k), with_kwargs=True))
    try:
        dev = next(priv.parameters()).device
        win = max(2, min(window, ids.numel()))
        chunks = [ids[s:s + win] for s in range(0, ids.numel() - win + 1, win)] or [ids]
        for s in range(0, len(chunks), batch_size):
            x = torch.stack(chunks[s:s + batch_size]).to(dev)
            priv(input_ids=x, use_cache=False, logits_to_keep=1)
            count += x.numel()
    finally:
        for h in handles:
            h.remove()
    return 1.0 - sums / count


@register("bi", description="Block Influence (ShortGPT): lowest 1 - mean per-token cos(in, out) first")
def bi(ctx, budget):
    constrained = bool(ctx.param("bi", "constrained", False))
    max_tokens = int(ctx.param("bi", "calib_tokens", 2048))
    ids = ctx.calib_ids(max_tokens)
    scores = block_influence(ctx.model, ids, window=ctx.evaluator.window)
    cands = list(ctx.candidates) if constrained else list(range(ctx.num_layers))
    spacing = ctx.spacing if constrained else 0
    check_budget(budget, cands if constrained else cands[:-1], spacing)
    order = sorted(cands, key=lambda i: (scores[i], i))
    picks = scan(order, budget, spacing)
    out = MethodOutput(sets=nested(picks), info={"bi": scores.tolist(), "calib_tokens": int(ids.numel())},
                       settings={"constrained": constrained, "spacing": spacing, "candidates": cands,
                                 "calib_tokens": int(ids.numel()), "window": ctx.evaluator.window,
                                 "calibration": "corpus prompt region (disjoint from the test text)"})
    if len(picks) < budget:
        out.notes.append(f"BI order stops after {len(picks)} layers under spacing Δ={spacing}")
    return out
