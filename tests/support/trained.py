"""Tiny models of the kinds the generic engine serves, trained for a few hundred steps on the shipped WikiText-2
text as byte-level language models (the tiny vocabulary of 256 ids is one id per byte), so that their blocks have
learned different jobs instead of being interchangeable random noise.  Used by tests/families/test_trained_kinds.py
and experiments/trained_kinds.py.

Regions of the text's bytes (disjoint, asserted): training ``[0, 0.8)``, held-out loss ``[0.8, 0.9)``, scoring
prompts ``[0.9, 1.0)``.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

WIKITEXT = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "wikitext-2-raw" / "wiki.test.raw"

#: model type -> what kind of stack it stands for
KINDS = {
    "bloom": "ALiBi biases shaped by the batch (one of the paper's families)",
    "gemma2": "final logit soft-capping, sliding and full attention alternating",
    "mamba": "state-space blocks, no attention",
    "jamba": "attention and Mamba blocks mixed, MoE every other block",
    "deepseek_v3": "a dense block before MoE blocks, latent attention",
    "exaone4": "sliding-window and full-attention layers mixed",
}

#: the kinds split over two test files (pytest-xdist gives each file to one worker): the state-space ones train on
#: transformers' sequential slow path and take as long as the other four together
GROUPS = {"attention": ["bloom", "deepseek_v3", "exaone4", "gemma2"], "state-space": ["jamba", "mamba"]}

REGIONS = {"train": (0.0, 0.8), "heldout": (0.8, 0.9), "prompts": (0.9, 1.0)}


def text_bytes(region: str) -> torch.Tensor:
    """The bytes of one region of the text as token ids, ``[N]`` int64."""
    raw = WIKITEXT.read_bytes()
    spans = {k: (int(a * len(raw)), int(b * len(raw))) for k, (a, b) in REGIONS.items()}
    ordered = sorted(spans.values())
    assert all(x[1] <= y[0] for x, y in zip(ordered, ordered[1:])), "text regions overlap"
    a, b = spans[region]
    return torch.tensor(list(raw[a:b]), dtype=torch.long)


def windows(region: str, n: int, tokens: int, seed: int) -> torch.Tensor:
    """``n`` random windows of ``tokens`` bytes from ``region``, ``[n, tokens]``."""
    data = text_bytes(region)
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - tokens, (n,), generator=g)
    return torch.stack([data[s:s + tokens] for s in starts.tolist()])


@torch.no_grad()
def heldout_loss(model, tokens: int = 64, n: int = 32) -> float:
    """Mean next-byte cross-entropy (nats) of ``model`` on ``n`` held-out windows."""
    model.eval()
    ids = windows("heldout", n, tokens, seed=123)
    return float(model(input_ids=ids, labels=ids, use_cache=False).loss)


def train_tiny(model_type: str, steps: int = 200, layers: int = 4, seed: int = 0, batch: int = 8,
               tokens: int = 32, lr: float = 3e-3) -> tuple[torch.nn.Module, dict]:
    """``(model, record)``: the tiny model of ``model_type`` (swapkl.model.tiny, unscaled initialisation) trained
    with AdamW for ``steps`` steps of ``batch`` windows of ``tokens`` bytes; ``record`` holds the held-out loss
    before and after (nats per byte) and the seconds it took.  Eval mode, float32."""
    import time

    from swapkl.model.tiny import tiny_model

    torch.manual_seed(seed)
    model = tiny_model(model_type, layers, seed=seed, scale=1.0)
    before = heldout_loss(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    data = text_bytes("train")
    g = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(data) - tokens, (batch,), generator=g).tolist()
        ids = torch.stack([data[s:s + tokens] for s in starts])
        for group in opt.param_groups:  # cosine decay to a tenth
            group["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    after = heldout_loss(model)
    return model.eval(), {"heldout_loss_before": before, "heldout_loss_after": after, "train_seconds": seconds,
                          "steps": steps}


def scoring_prompts(n: int = 2, tokens: int = 16) -> torch.Tensor:
    """The scoring prompts, ``[n, tokens]`` byte ids from the prompts region."""
    return windows("prompts", n, tokens, seed=7)


def measured(model, ids: torch.Tensor, per_layer: str) -> dict:
    """The swap-KLs of ``model`` (float64) on ``ids`` for adjacent pairs under ``per_layer``, from the engine:
    ``{"pairs": [[i, j]...], "replacement": [nats], "interchange": [nats], "n/a": count}``, replacement the mean of
    both directions, each the mean over prompts and positions."""
    from swapkl.contract import pair_list
    from swapkl.scoring.engine import SwapEngine

    engine = SwapEngine(model, ids, per_layer=per_layer, kl_dtype=torch.float64)
    pairs = pair_list("adjacent", engine.num_layers)
    undefined = engine.undefined(pairs)
    todo = [p for p in pairs if p not in undefined]
    got = engine.sweep(todo)
    return {"pairs": [list(p) for p in todo],
            "replacement": [float((got[p]["repl_ij"].mean() + got[p]["repl_ji"].mean()) / 2) for p in todo],
            "interchange": [float(got[p]["inter"].mean()) for p in todo], "n/a": len(undefined)}


def check_trained(model, record: dict, folder: str) -> None:
    """Asserts that the trained ``model`` learned (held-out loss down by more than a nat per byte from ln 256 ≈
    5.5), that both protocols under both per-layer definitions equal the plain implementations with every swap
    visible (mean KL above 1e-6 nats), and that its pruned export reloads and equals the plain removal."""
    from swapkl.contract import PER_LAYER
    from swapkl.support.check import EXACT, check_export, compare, widest

    assert record["heldout_loss_after"] < record["heldout_loss_before"] - 1.0, record
    ids = scoring_prompts()
    wide, dtype = widest(model, ids)
    for per_layer in PER_LAYER:
        got = compare(wide, ids, dtype, "block", per_layer)
        assert got["status"] == EXACT, (per_layer, got)
        assert got["min_kl"] > 1e-6, (per_layer, got)
    assert check_export(wide, ids, dtype, folder)["status"] == EXACT
