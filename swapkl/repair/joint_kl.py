"""Per-prompt KL(base ‖ variant) of whole models on the scoring prompts: the measure of a removal set with several
bridges at once (each span its own map), which the span sweep (:mod:`swapkl.repair.sweep`, one span per variant)
does not cover.  A plain forward of the variant model on the prompts, a few prompts per call, scored at the
contract's positions through the KL of :mod:`swapkl.scoring.kl`."""
from __future__ import annotations

import torch

from swapkl.scoring.kl import kl_from_logits

#: bytes of baseline log-probs kept between calls (above it they are recomputed per call)
BASE_CACHE_BYTES = 512 * 2**20


class JointKL:
    """``JointKL(base, ids, positions, kl_dtype)(variant) -> [P]`` float64 nats on the CPU: for each prompt of
    ``ids`` [P, T] the mean over its scored positions (``"all"``: every position; ``"last"``: the last) of
    KL(base ‖ variant).  ``rows``: prompts per forward.  The base's log-probs are computed once when they fit
    :data:`BASE_CACHE_BYTES`."""

    def __init__(self, base: torch.nn.Module, ids: torch.Tensor, positions: str = "all",
                 kl_dtype: torch.dtype = torch.float32, rows: int = 8):
        self.base, self.ids, self.positions, self.kl_dtype = base, ids, positions, kl_dtype
        self.rows = max(1, int(rows))
        P, T = ids.shape
        Ts = T if positions == "all" else 1
        vocab = int(base.get_output_embeddings().weight.shape[0])
        item = torch.finfo(kl_dtype).bits // 8
        self.cached = None
        if P * Ts * vocab * item <= BASE_CACHE_BYTES:
            self.cached = [self._base_logp(a) for a in range(0, P, self.rows)]

    @torch.inference_mode()
    def _logits(self, model: torch.nn.Module, a: int) -> torch.Tensor:
        dev = next(model.parameters()).device
        out = model(input_ids=self.ids[a:a + self.rows].to(dev), use_cache=False).logits
        return out if self.positions == "all" else out[:, -1:, :]

    def _base_logp(self, a: int) -> torch.Tensor:
        return torch.log_softmax(self._logits(self.base, a).to(self.kl_dtype), dim=-1)

    @torch.inference_mode()
    def __call__(self, variant: torch.nn.Module) -> torch.Tensor:
        out = []
        for k, a in enumerate(range(0, self.ids.shape[0], self.rows)):
            logp = self.cached[k] if self.cached is not None else self._base_logp(a)
            logits = self._logits(variant, a)
            logp = logp.to(logits.device)
            out.append(kl_from_logits(logp.exp(), logp, logits).mean(-1).double().cpu())
        return torch.cat(out)
