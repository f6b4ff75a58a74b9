"""The plain, obviously correct swap-KL implementation (the way the paper's scripts work).

Every variant is a full forward from the token ids, batch of one, with the moved weights copied into the slots by
``load_state_dict`` (and restored afterwards).  For a sublayer unit (docs/method.md "Sublayer units") the weights
copied into slot i are slot i's own block with the unit's entries taken from block j
(:func:`~swapkl.model.units.mixed_weights`).  It is slow on purpose: the engine is tested and benchmarked against it.
"""
from __future__ import annotations

import copy

import torch

from swapkl.model.architectures import locate
from swapkl.model.units import layout_for, mixed_weights, unit_keys


class PlainReference:
    """A private copy of ``model`` whose slots take any weights: :meth:`kl` of a variant given as
    ``{slot: state_dict}`` against the unmodified model, per prompt, by full forwards."""

    @torch.inference_mode()
    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, positions: str = "all",
                 kl_dtype: torch.dtype = torch.float64):
        self.model, self.ids, self.positions, self.kl_dtype = model, ids, positions, kl_dtype
        self.work = copy.deepcopy(model).eval()
        self.blocks = locate(self.work).blocks
        #: each block's weights as they were (cloned: the copy's blocks are overwritten and restored)
        self.original = [{k: v.clone() for k, v in b.state_dict().items()} for b in locate(model).blocks]
        self.base = [self._forward(ids[p]) for p in range(ids.shape[0])]

    def _forward(self, row: torch.Tensor) -> torch.Tensor:
        logits = self.work(input_ids=row[None], use_cache=False).logits[0].to(self.kl_dtype)
        if self.positions == "last":
            logits = logits[-1:]
        return torch.log_softmax(logits, -1)

    def unit_weights(self, slot: int, block: int, unit: str) -> dict:
        """What slot ``slot`` holds when it takes block ``block``'s ``unit``: block ``block``'s weights for
        ``block``, else slot ``slot``'s own with the unit's entries from block ``block``."""
        if unit == "block":
            return self.original[block]
        keys = unit_keys(self.blocks[slot], layout_for(self.model, locate(self.model)), unit)
        return mixed_weights(self.original[slot], self.original[block], keys)

    @torch.inference_mode()
    def kl(self, assign: dict) -> torch.Tensor:
        """Per-prompt KL [P] (nats, ``kl_dtype``) of the model whose slots hold ``assign[slot]`` (state dicts)."""
        for slot, weights in assign.items():
            self.blocks[slot].load_state_dict(weights)
        try:
            vals = []
            for p in range(self.ids.shape[0]):
                lp = self._forward(self.ids[p])
                vals.append((self.base[p].exp() * (self.base[p] - lp)).sum(-1).mean())
            return torch.stack(vals)
        finally:
            for slot in assign:
                self.blocks[slot].load_state_dict(self.original[slot])


@torch.inference_mode()
def reference_sweep(model: torch.nn.Module, ids: torch.Tensor, pairs, positions: str = "all",
                    kl_dtype: torch.dtype = torch.float64, unit: str = "block") -> dict:
    """``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` per-prompt KL vectors [P] (nats, CPU): ``repl_ij`` slot i
    takes block j's ``unit``, ``repl_ji`` slot j takes block i's, ``inter`` both at once.

    ``kl_dtype``: float64 (default, for tests: the most accurate target) or float32 (as the paper's scripts,
    for benchmarks)."""
    ref = PlainReference(model, ids, positions, kl_dtype)
    out = {}
    for i, j in pairs:
        wij, wji = ref.unit_weights(i, j, unit), ref.unit_weights(j, i, unit)
        out[(i, j)] = {"repl_ij": ref.kl({i: wij}), "repl_ji": ref.kl({j: wji}), "inter": ref.kl({i: wij, j: wji})}
    return out
