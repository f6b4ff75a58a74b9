"""The output end of a sweep: the final norm and head on last-block outputs, the baseline's distribution (cached
when it fits, else recomputed per chunk of prompts) and each variant's per-prompt KL through the chosen KL
implementation (:class:`~swapkl.scoring.kl.KLFunction`).  Used by :class:`swapkl.scoring.engine.SwapEngine`."""
from __future__ import annotations

import time

import torch

from swapkl.scoring.kl import KLFunction, base_distribution, kl_bytes_per_element
from swapkl.scoring.slots import Baseline, BatchController, BlockRunner

#: bytes one chunk of the KL (kl_bytes_per_element) may hold when no size is given
DEFAULT_KL_CHUNK_BYTES = 256 * 2**20


class HeadKL:
    """Head + KL for one sweep.  ``batch`` sizes the chunks of prompts (halved on out-of-memory); ``stats`` (a
    :class:`~swapkl.scoring.engine.SweepStats`) receives the head positions run and, with ``timing`` (the device
    synchronised around each call), the seconds in the head + KL and in the KL alone."""

    def __init__(self, runner: BlockRunner, positions: str, kl_dtype: torch.dtype, kl: KLFunction,
                 batch: BatchController, stats, timing: bool = False):
        self.runner, self.positions, self.kl_dtype = runner, positions, kl_dtype
        self.kl, self.batch, self.stats, self.timing = kl, batch, stats, timing
        self.base: Baseline | None = None
        self.cache: tuple[torch.Tensor, torch.Tensor] | None = None  # (p, log p), each [P, Ts, V]

    @property
    def vocab(self) -> int:
        w = getattr(self.runner.loc.head, "weight", None)
        return int(w.shape[0]) if w is not None else int(self.runner.model.config.vocab_size)

    def default_chunk_rows(self, num_tokens: int) -> int:
        """Prompts per KL chunk keeping one chunk's tensors under :data:`DEFAULT_KL_CHUNK_BYTES`."""
        Ts = num_tokens if self.positions == "all" else 1
        item = torch.finfo(self.kl_dtype).bits // 8
        per = kl_bytes_per_element(self.runner.dtype.itemsize, item) * Ts * self.vocab
        return max(1, int(DEFAULT_KL_CHUNK_BYTES // per))

    def start(self, base: Baseline, num_prompts: int, num_tokens: int, logp_budget: int) -> None:
        """Attach the baseline; cache its (p, log p) when both fit ``logp_budget`` bytes."""
        self.base = base
        Ts = num_tokens if self.positions == "all" else 1
        item = torch.finfo(self.kl_dtype).bits // 8
        if 2 * num_prompts * Ts * self.vocab * item <= logp_budget:
            self.cache = self._fill_cache(num_prompts, Ts, self.vocab)

    def scored(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.positions == "all" else h[:, -1:, :]

    @torch.inference_mode()
    def _fill_cache(self, P: int, Ts: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The baseline (p, log p) of every prompt, [P, Ts, V] each, written chunk by chunk into tensors made
        once (so the cache never exists twice over, as a list of chunks and their concatenation)."""
        dev = self.runner.head_device()
        cache = (torch.empty(P, Ts, V, dtype=self.kl_dtype, device=dev),
                 torch.empty(P, Ts, V, dtype=self.kl_dtype, device=dev))

        def fill(a: int, b: int) -> None:
            p, logp = self.base_dist(a, b)
            cache[0][a:b], cache[1][a:b] = p, logp

        self.batch.map(fill, P, "kl")
        return cache

    @torch.inference_mode()
    def base_logp(self, a: int, b: int) -> torch.Tensor:
        """Baseline log-probs [b - a, Ts, V] of prompts a..b-1 (recomputed)."""
        h = self.scored(self.base.states[-1][a:b])
        return torch.log_softmax(self.runner.logits(h).to(self.kl_dtype), dim=-1)

    @torch.inference_mode()
    def base_dist(self, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Baseline (p, log p) for prompts a..b-1 at the scored positions (cached or recomputed)."""
        if self.cache is not None:
            return self.cache[0][a:b], self.cache[1][a:b]
        h = self.scored(self.base.states[-1][a:b])
        self.stats.head_positions += h.shape[0] * h.shape[1]
        return base_distribution(self.runner.logits(h), self.kl_dtype)

    def _clock(self, dev: torch.device) -> float:
        if self.timing and dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    @torch.inference_mode()
    def kl_many(self, h_lasts: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-prompt KL [P] (nats, in ``kl_dtype``, on CPU) of each variant's last-block output [P, T, D].

        Works in chunks of ``batch.max_rows`` prompts: the baseline log-probs of a chunk are computed (or read
        from the cache) once and shared by every variant, so at most a few ``[rows, Ts, V]`` tensors exist at a
        time; each variant's per-prompt means stay on the device until the chunk is done (one copy back)."""
        if not h_lasts:
            return []

        def chunk(a: int, b: int) -> torch.Tensor:
            p, logp = self.base_dist(a, b)
            out = []
            for h in h_lasts:
                hs = self.scored(h[a:b])
                t0 = self._clock(hs.device)
                logits = self.runner.logits(hs)
                p, logp = p.to(logits.device), logp.to(logits.device)
                t1 = self._clock(logits.device)
                out.append(self.kl(p, logp, logits).mean(-1))
                if self.timing:
                    t2 = self._clock(logits.device)
                    self.stats.kl_seconds += t2 - t1
                    self.stats.head_kl_seconds += t2 - t0
                self.stats.head_positions += hs.shape[0] * hs.shape[1]
                del logits
            return torch.stack([o.to(out[0].device) for o in out], 0).cpu()  # [variants, b - a]

        return list(torch.cat(self.batch.map(chunk, h_lasts[0].shape[0], "kl"), 1).unbind(0))
