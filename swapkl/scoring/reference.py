"""The plain, obviously correct swap-KL implementation (the way the paper's scripts work).

Every variant is a full forward from the token ids, batch of one, with the moved blocks' weights copied
into the slots by ``load_state_dict`` (and restored afterwards).  It is slow on purpose: the engine is
tested and benchmarked against it.
"""
from __future__ import annotations

import copy

import torch

from swapkl.model.architectures import locate


@torch.inference_mode()
def reference_sweep(model: torch.nn.Module, ids: torch.Tensor, pairs, positions: str = "all",
                    kl_dtype: torch.dtype = torch.float64) -> dict:
    """``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` per-prompt KL vectors [P] (nats, CPU).

    ``kl_dtype``: float64 (default, for tests: the most accurate target) or float32 (as the paper's scripts,
    for benchmarks)."""
    work = copy.deepcopy(model).eval()
    blocks = locate(work).blocks
    original = [{k: v.clone() for k, v in b.state_dict().items()} for b in locate(model).blocks]

    def forward(row: torch.Tensor) -> torch.Tensor:
        logits = work(input_ids=row[None], use_cache=False).logits[0].to(kl_dtype)
        if positions == "last":
            logits = logits[-1:]
        return torch.log_softmax(logits, -1)

    def run_variant(assign: dict[int, int]) -> torch.Tensor:
        for slot, block in assign.items():
            blocks[slot].load_state_dict(original[block])
        try:
            vals = []
            for p in range(ids.shape[0]):
                lp = forward(ids[p])
                vals.append((base[p].exp() * (base[p] - lp)).sum(-1).mean())
            return torch.stack(vals)
        finally:
            for slot in assign:
                blocks[slot].load_state_dict(original[slot])

    base = [forward(ids[p]) for p in range(ids.shape[0])]
    out = {}
    for i, j in pairs:
        out[(i, j)] = {
            "repl_ij": run_variant({i: j}),
            "repl_ji": run_variant({j: i}),
            "inter": run_variant({i: j, j: i}),
        }
    return out
