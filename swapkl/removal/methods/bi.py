"""Block Influence (ShortGPT): ``BI_i = 1 - mean over tokens of cos(h_in_t, h_out_t)`` of block i; and the
optional linear-CKA baseline (CKA of block input vs output, most similar removed first).

Per-token cosine between the block's input and output hidden states, read with forward hooks on the blocks of a
private module tree (:func:`swapkl.surgery.prune.pruned_copy` with nothing removed, so the caller's model never carries a
hook), on calibration text (the corpus's prompt region, disjoint from the test text).  Lowest BI is removed first.
Literature default: every layer is a candidate and there is no spacing rule (``params["bi"] = {"constrained":
True}`` applies the guided methods' candidates and spacing instead).
"""
from __future__ import annotations

import numpy as np

from swapkl.contract import SUBLAYERS
from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens
from swapkl.removal.selection import nested, scan
from swapkl.model.block_io import hidden_in, hidden_of

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "bi", "run": "bi",
     "description": "Block Influence (ShortGPT): lowest 1 - mean per-token cos(in, out) first",
     "label": "Block Influence", "rule_candidates": False, "offered": True, "cli_default": True,
     "default_in": ["study"], "order": 5,
     "units": "any", "calibration": 2048},
    {"name": "cka", "run": "cka",
     "description": "linear CKA of block input vs output: highest (most similar) first", "rule_candidates": False,
     "order": 7, "calibration": 2048},
]


# torch (and swapkl.model.architectures, which needs it) are imported inside the functions that compute: the registry
# imports this module, and the dashboard's first paint and ``swapkl --help`` must not load torch.


def run_block_io(model, ids, on_block, window: int = 512, batch_size: int = 4) -> int:
    """Feed ``ids`` (1-D LongTensor) in non-overlapping windows through a private copy of ``model`` and call
    ``on_block(k, h_in, h_out)`` (float32, (B, T, H)) for every block k and batch, from forward hooks.  The
    caller's model never carries a hook.  Returns the number of tokens fed."""
    import torch

    with torch.no_grad():
        return _run_block_io(model, ids, on_block, window, batch_size)


def _run_block_io(model, ids, on_block, window: int, batch_size: int) -> int:
    from swapkl.model import architectures as arch
    from swapkl.surgery.blocks import pruned_copy

    priv = pruned_copy(model, [])
    blocks = arch.locate(priv).blocks
    inputs: dict = {}
    handles = []

    def pre(k):
        def hook(mod, args, kwargs):
            inputs[k] = hidden_of(hidden_in(args, kwargs))
        return hook

    def post(k):
        def hook(mod, args, kwargs, out):
            on_block(k, inputs.pop(k).float(), hidden_of(out).float())
        return hook

    for k, b in enumerate(blocks):
        handles.append(b.register_forward_pre_hook(pre(k), with_kwargs=True))
        handles.append(b.register_forward_hook(post(k), with_kwargs=True))
    try:
        return _forward_windows(priv, ids, window, batch_size)
    finally:
        for h in handles:
            h.remove()


def _forward_windows(model, ids, window: int, batch_size: int) -> int:
    """Run ``model`` over ``ids`` (1-D token ids) cut into windows of ``window`` tokens (at least 2; the whole
    text when shorter), ``batch_size`` windows at a time, for its hooks; no logits kept beyond the last position.
    Returns the number of tokens run."""
    import torch  # deferred: the method registry must import without it

    dev = next(model.parameters()).device
    win = max(2, min(window, ids.numel()))
    chunks = [ids[s:s + win] for s in range(0, ids.numel() - win + 1, win)] or [ids]
    count = 0
    for s in range(0, len(chunks), batch_size):
        x = torch.stack(chunks[s:s + batch_size]).to(dev)
        model(input_ids=x, use_cache=False, logits_to_keep=1)
        count += x.numel()
    return count


def block_influence(model, ids, window: int = 512, batch_size: int = 4) -> np.ndarray:
    """(L,) float64: BI of every block on ``ids`` (1-D LongTensor) cut into non-overlapping windows:
    ``1 - mean over tokens of cos(h_in_t, h_out_t)`` (per token, not over the flattened sequence)."""
    import torch  # deferred: the method registry must import without it

    from swapkl.model import architectures as arch

    L = arch.locate(model).num_layers
    sums = np.zeros(L)

    def on_block(k, h_in, h_out):
        sums[k] += float(torch.nn.functional.cosine_similarity(h_in, h_out, dim=-1).double().sum())

    count = run_block_io(model, ids, on_block, window, batch_size)
    return 1.0 - sums / count


def linear_cka(model, ids, window: int = 512, batch_size: int = 4) -> np.ndarray:
    """(L,) float64: linear CKA between each block's input and output over all tokens (features centred),
    ``||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)``, accumulated in float64 (hidden × hidden Gram matrices)."""
    import torch  # deferred: the method registry must import without it

    from swapkl.model import architectures as arch

    L = arch.locate(model).num_layers
    acc: dict[int, dict] = {}

    def on_block(k, h_in, h_out):
        x = h_in.reshape(-1, h_in.shape[-1]).double()
        y = h_out.reshape(-1, h_out.shape[-1]).double()
        a = acc.setdefault(k, {"n": 0, "sx": 0, "sy": 0, "xx": 0, "yy": 0, "yx": 0})
        a["n"] += x.shape[0]
        a["sx"] = a["sx"] + x.sum(0)
        a["sy"] = a["sy"] + y.sum(0)
        a["xx"] = a["xx"] + x.T @ x
        a["yy"] = a["yy"] + y.T @ y
        a["yx"] = a["yx"] + y.T @ x

    run_block_io(model, ids, on_block, window, batch_size)
    out = np.zeros(L)
    for k in range(L):
        a = acc[k]
        n, mx, my = a["n"], a["sx"] / a["n"], a["sy"] / a["n"]
        cxx = a["xx"] - n * torch.outer(mx, mx)
        cyy = a["yy"] - n * torch.outer(my, my)
        cyx = a["yx"] - n * torch.outer(my, mx)
        out[k] = float((cyx ** 2).sum() / (torch.linalg.norm(cxx) * torch.linalg.norm(cyy)))
    return out


def _calibrated(ctx, budget, name, score_fn, descending):
    """Score every block with ``score_fn(model, ids, window)`` on calibration text and remove in score order."""
    max_tokens = calib_tokens(ctx, name)
    ids = ctx.calib_ids(max_tokens)
    scores = score_fn(ctx.model, ids, window=ctx.evaluator.window)
    cands, spacing, settings = ctx.literature_candidates(name, budget)
    picks = scan(sorted(cands, key=lambda i: ((-scores[i]) if descending else scores[i], i)), budget, spacing)
    out = MethodOutput(sets=nested(picks), info={name: scores.tolist(), "calib_tokens": int(ids.numel())},
                       settings=settings | {"calib_tokens": int(ids.numel()), "window": ctx.evaluator.window,
                                            "calibration": "corpus prompt region (disjoint from the test text)"})
    if len(picks) < budget:
        out.notes.append(f"{name} order stops after {len(picks)} layers under spacing Δ={spacing}")
    return out


def sublayer_influence(model, ids, unit: str, window: int = 512, batch_size: int = 4) -> np.ndarray:
    """(L,) float64: BI of every block's ``unit`` sublayer, ``1 - mean over tokens of cos(r, r + f(r))`` where
    ``r`` is the residual stream the sublayer adds to (the block input for attention; the block input plus the
    attention branch for the MLP, in sequential and parallel-residual blocks alike) and ``f(r)`` its branch (the
    output of the unit's last module: the core, or its post-norm)."""
    import torch  # deferred: the method registry must import without it

    from swapkl.model import architectures as arch
    from swapkl.model.units import layout_for
    from swapkl.surgery.blocks import pruned_copy

    priv = pruned_copy(model, [])
    loc = arch.locate(priv)
    layout = layout_for(model, arch.locate(model))
    sums, seen, handles = np.zeros(loc.num_layers), {}, []

    def pre(k):
        def hook(mod, args, kwargs):
            seen[k] = {"in": hidden_of(hidden_in(args, kwargs)).float()}
        return hook

    def branch(k, u):
        def hook(mod, args, out):
            seen[k][u] = hidden_of(out).float()
        return hook

    def post(k):
        def hook(mod, args, out):
            s = seen.pop(k)
            r = s["in"] + (s["attention"] if unit == "mlp" else 0)
            cos = torch.nn.functional.cosine_similarity(r, r + s[unit], dim=-1)
            sums[k] += float(cos.double().sum())
        return hook

    for k, b in enumerate(loc.blocks):
        handles.append(b.register_forward_pre_hook(pre(k), with_kwargs=True))
        for u in SUBLAYERS:
            handles.append(arch.get_path(b, layout.spec(u).modules[-1]).register_forward_hook(branch(k, u)))
        handles.append(b.register_forward_hook(post(k)))
    try:
        with torch.no_grad():
            count = _forward_windows(priv, ids, window, batch_size)
    finally:
        for h in handles:
            h.remove()
    return 1.0 - sums / count


def bi(ctx, budget):
    if ctx.unit != "block":
        return _calibrated(ctx, budget, "bi", lambda m, ids, window: sublayer_influence(m, ids, ctx.unit, window),
                           descending=False)
    return _calibrated(ctx, budget, "bi", block_influence, descending=False)


def cka(ctx, budget):
    return _calibrated(ctx, budget, "cka", linear_cka, descending=True)
