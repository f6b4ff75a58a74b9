"""Angular distance (Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper Layers"): remove the block
of ``n`` consecutive layers ``ℓ..ℓ+n-1`` whose input and output residual streams are closest in angle.

``d(ℓ, ℓ+n) = mean over tokens of arccos(cos(x_ℓ, x_{ℓ+n})) / π`` (in [0, 1]), where ``x_k`` is the residual
stream entering block k (``x_L``: the last block's output, before the final norm).  The paper measures it at the
last token; this implementation averages over every token (the per-token variant; docs/evidence.md).  At budget n
the block with the smallest ``d(ℓ, ℓ+n)`` over ``ℓ = 0..L-n`` is removed, so the sets are *not* nested (the
removal curve is the paper's block-size-n curve).  Calibration text: the corpus's prompt region, cut into
non-overlapping windows of the evaluator's length, disjoint from the test text.  As a per-layer signal (block
size 1) the score of layer ℓ is ``d(ℓ, ℓ+1)``, lower = safer.
"""
from __future__ import annotations

import numpy as np

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens
from swapkl.model.block_io import hidden_in, hidden_of

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "angular", "run": "angular",
     "description": "angular distance (Gromov et al. 2024): remove the n consecutive layers whose input and output "
                    "residual streams are closest in angle",
     "label": "angular distance", "rule_candidates": False, "order": 9, "calibration": 2048},
]

# torch and the torch-based swapkl modules are imported inside the functions: the registry reads this file, and the
# CLI's --help and the dashboard's first paint must not load torch.


def residual_stats(model, rows, batch_size: int = 8) -> dict:
    """Per-row statistics of the residual stream of ``model`` on ``rows`` ((U, T) LongTensor, each row fed as one
    sequence): ``"angular"`` (U, L+1, L+1) float64, the mean over the row's tokens of ``arccos(cos(x_a, x_b)) / π``
    (symmetric, 0 on the diagonal); ``"cos_adjacent"`` (U, L), the mean over tokens of ``cos(x_ℓ, x_{ℓ+1})`` (Block
    Influence is ``1 -`` it).  Forward hooks on a private module tree; the caller's model carries none."""
    import torch

    with torch.no_grad():
        return _residual_stats(model, torch.as_tensor(rows).long(), batch_size)


def _residual_stats(model, rows, batch_size):
    import torch

    from swapkl.model import architectures as arch
    from swapkl.surgery.prune import pruned_copy

    priv = pruned_copy(model, [])
    blocks = arch.locate(priv).blocks
    L = len(blocks)
    states: dict = {}
    handles = [b.register_forward_pre_hook(
        lambda m, args, kwargs, k=k: states.__setitem__(k, hidden_of(hidden_in(args, kwargs))),
        with_kwargs=True) for k, b in enumerate(blocks)]
    handles.append(blocks[L - 1].register_forward_hook(lambda m, a, out: states.__setitem__(L, hidden_of(out))))
    U = rows.shape[0]
    ang = np.zeros((U, L + 1, L + 1))
    cos_adj = np.zeros((U, L))
    dev = next(priv.parameters()).device
    try:
        for s in range(0, U, batch_size):
            x = rows[s:s + batch_size].to(dev)
            states.clear()
            priv(input_ids=x, use_cache=False, logits_to_keep=1)
            xs = torch.stack([states[k].double() for k in range(L + 1)], 1)  # (B, L+1, T, H)
            xs = xs / xs.norm(dim=-1, keepdim=True).clamp_min(1e-30)
            cos = torch.einsum("bath,bcth->bact", xs, xs).clamp(-1.0, 1.0)  # (B, L+1, L+1, T)
            ang[s:s + len(x)] = (torch.arccos(cos) / torch.pi).mean(-1).cpu().numpy()
            idx = torch.arange(L)
            cos_adj[s:s + len(x)] = cos[:, idx, idx + 1].mean(-1).cpu().numpy()
    finally:
        for h in handles:
            h.remove()
    for k in range(L + 1):
        ang[:, k, k] = 0.0
    return {"angular": ang, "cos_adjacent": cos_adj}


def best_blocks(d: np.ndarray, budget: int) -> list[list[int]]:
    """The removal set for n = 1..``budget`` from a (L+1, L+1) distance matrix: ``ℓ..ℓ+n-1`` with the smallest
    ``d[ℓ, ℓ+n]`` (ties: the lower ℓ)."""
    L = d.shape[0] - 1
    out = []
    for n in range(1, budget + 1):
        vals = [d[ell, ell + n] for ell in range(L - n + 1)]
        ell = int(np.argmin(vals))
        out.append(list(range(ell, ell + n)))
    return out


def calib_rows(ctx, max_tokens: int):
    """The calibration text (``ctx.calib_ids``) cut into non-overlapping windows of the evaluator's length."""
    import torch

    ids = ctx.calib_ids(max_tokens)
    win = max(2, min(int(ctx.evaluator.window), ids.numel()))
    chunks = [ids[s:s + win] for s in range(0, ids.numel() - win + 1, win)] or [ids]
    return torch.stack(chunks)


def angular(ctx, budget):
    from swapkl.errors import SwapklError

    L = ctx.num_layers
    if budget > L - 1:
        raise SwapklError(f"angular: budget {budget} would remove every layer of {L}; at most {L - 1}")
    max_tokens = calib_tokens(ctx, "angular")
    rows = calib_rows(ctx, max_tokens)
    d = residual_stats(ctx.model, rows)["angular"].mean(0)  # equal-length windows: the mean over all tokens
    sets = best_blocks(d, budget)
    return MethodOutput(sets=sets, info={"angular": d.tolist(), "layer_scores": [float(d[k, k + 1]) for k in range(L)],
                                         "calib_tokens": int(rows.numel())},
                        settings={"calib_tokens": int(rows.numel()), "window": int(rows.shape[1]),
                                  "block": "n consecutive layers at budget n (not nested)",
                                  "distance": "mean over tokens of arccos(cos(x_l, x_l+n)) / pi",
                                  "calibration": "corpus prompt region (disjoint from the test text)"})
