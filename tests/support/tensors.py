"""Tensor helpers the tests share."""
from __future__ import annotations

import torch


def logits(model, x: torch.Tensor) -> torch.Tensor:
    """``model``'s logits [B, T, V] on the token ids ``x`` [B, T], without gradients or a KV cache."""
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits
