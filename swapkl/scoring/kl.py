"""KL(base || variant) per position from logits: the textbook form, the engine's plain form, and the faster forms
the engine picks from (a recorded setting, :class:`KLFunction`).

All four compute the same sum ``sum_v p(v) (log p(v) - log q(v))`` in nats from float32 (or float64) log-softmax:

* ``plain`` - :func:`kl_from_logits`: upcast, log-softmax, subtract, multiply, sum over the whole
  ``[rows, Ts, V]`` chunk (five passes over memory, each writing a ``[rows, Ts, V]`` float32 tensor);
* ``chunked`` - :func:`kl_chunked`: the same operations, bit for bit, on slices of a few positions so that every
  intermediate stays in the CPU cache (about 2x faster on a CPU, bf16 logits even more; never slower);
* ``compiled`` - :func:`kl_compiled`: the same formula through ``torch.compile``, which fuses the upcast, the
  log-softmax's reductions and the weighted sum into a couple of kernels that read each input once or twice and
  write only the ``[rows, Ts]`` result (the GPU choice: the KL is memory-bound there).  Equal to ``plain`` to
  float32 rounding (the reductions are ordered differently), not bit for bit;
* ``auto`` - ``compiled`` on CUDA, ``chunked`` elsewhere (compiling on a CPU takes about a minute and is slower
  than ``chunked``).  A compiled KL that fails to build, or disagrees with ``plain`` on its first call, falls back
  to ``chunked`` for the rest of the run; :attr:`KLFunction.record` says what ran and why.
"""
from __future__ import annotations

import torch

KL_IMPLS = ("auto", "compiled", "chunked", "plain")
#: bytes of one float32 [rows, V] slice in the chunked KL: small enough for the CPU's L2/L3 cache
CPU_SLICE_BYTES = 2 * 2**20
#: on a GPU a slice only bounds the temporaries (kernels are fast; launches are not free)
GPU_SLICE_BYTES = 256 * 2**20


def kl_rows(logp_base: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(base || variant) per position: ``logp_base`` log-probs [..., V] (float32, or float64 for
    ``kl_dtype="float64"``), ``logits`` [..., V] -> [...] in nats, in ``logp_base``'s dtype.  The textbook
    form; :func:`kl_from_logits` is the fast one."""
    logp = torch.log_softmax(logits.to(logp_base.dtype), dim=-1)
    return (logp_base.exp() * (logp_base - logp)).sum(-1)


def base_distribution(logits: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """From baseline logits [..., V]: probabilities ``p`` and log-probabilities ``log p`` ([..., V], in
    ``dtype``: float32, or float64 for the contract's ``kl_dtype="float64"``)."""
    logp = torch.log_softmax(logits.to(dtype), dim=-1)
    return logp.exp(), logp


def kl_from_logits(p_base: torch.Tensor, logp_base: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(base || variant) per position, nats, from the cached base ``p``/``log p`` [..., V] and the variant's
    ``logits`` [..., V] (the ``plain`` implementation).  Equal to :func:`kl_rows` (same float32 summation, same
    accuracy) but with the base's exp cached and every intermediate formed in place: about 3x faster for large V.
    (A dot product ``p . (log p - log q)`` through BLAS is faster still but loses two digits: its blocked float32
    accumulation is worse than torch's cascade sum.)  Computed in ``logp_base``'s dtype."""
    logq = torch.log_softmax(logits.to(logp_base.dtype), dim=-1)
    return torch.sub(logp_base, logq, out=logq).mul_(p_base).sum(-1)


def kl_chunked(p_base: torch.Tensor, logp_base: torch.Tensor, logits: torch.Tensor,
               slice_bytes: int = CPU_SLICE_BYTES) -> torch.Tensor:
    """:func:`kl_from_logits` over slices of positions (each ``slice_bytes`` of float32 log-probs at most): the
    same operations on the same rows, so the same bits, with temporaries of one slice instead of the chunk."""
    V = logits.shape[-1]
    n = logits.numel() // max(1, V)
    step = max(1, slice_bytes // (V * logp_base.element_size()))
    if step >= n:  # one slice: the plain KL as is
        return kl_from_logits(p_base, logp_base, logits)
    shape = logits.shape[:-1]
    z, p, lp = logits.reshape(-1, V), p_base.reshape(-1, V), logp_base.reshape(-1, V)
    out = torch.empty(n, dtype=logp_base.dtype, device=logits.device)
    for a in range(0, n, step):
        out[a:a + step] = kl_from_logits(p[a:a + step], lp[a:a + step], z[a:a + step])
    return out.reshape(shape)


def _kl_formula(p_base: torch.Tensor, logp_base: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    logq = torch.log_softmax(logits.to(logp_base.dtype), dim=-1)
    return (p_base * (logp_base - logq)).sum(-1)


_COMPILED = None


def kl_compiled(p_base: torch.Tensor, logp_base: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The KL formula through ``torch.compile`` (built on first use, dynamic shapes: the chunk size and the
    vocabulary may change without a rebuild).  Raises whatever compiling raises (no compiler, no triton)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(_kl_formula, dynamic=True, fullgraph=True)
    return _COMPILED(p_base, logp_base, logits)


def kl_bytes_per_element(logits_bytes: int, kl_bytes: int = 4, cached_base: bool = False) -> int:
    """Bytes held per element of a ``[rows, Ts, V]`` KL chunk by the ``plain`` KL (the most any implementation
    holds): the base ``p`` and ``log p`` (unless they are slices of the cached baseline), the variant's logits in
    the model's dtype, their upcast copy (when the model's dtype is narrower) and ``log q``.  bf16 logits with
    float32 KL: 4 + 4 + 2 + 4 + 4 = 18."""
    base = 0 if cached_base else 2 * kl_bytes
    upcast = kl_bytes if logits_bytes != kl_bytes else 0
    return base + logits_bytes + upcast + kl_bytes


class KLFunction:
    """The KL the engine calls, ``kl(p, logp, logits) -> [...]`` (nats), as chosen by ``impl`` (one of
    :data:`KL_IMPLS`) for ``device``.  ``record`` is what the run used: ``{"asked", "used", "fallback"}``
    (``fallback`` says why a compiled KL was not used, else None); it goes into the result's meta."""

    def __init__(self, impl: str = "auto", device: torch.device | str = "cpu"):
        if impl not in KL_IMPLS:
            raise ValueError(f"KL implementation must be one of {', '.join(KL_IMPLS)}, got {impl!r}")
        dev = torch.device(device)
        self.slice_bytes = GPU_SLICE_BYTES if dev.type == "cuda" else CPU_SLICE_BYTES
        used = impl if impl != "auto" else ("compiled" if dev.type == "cuda" else "chunked")
        self.record = {"asked": impl, "used": used, "fallback": None}
        self._checked = used != "compiled"

    @property
    def used(self) -> str:
        return self.record["used"]

    def _fall_back(self, why: str) -> None:
        self.record.update(used="chunked", fallback=why[:300])
        self._checked = True

    def __call__(self, p_base: torch.Tensor, logp_base: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if self.used == "plain":
            return kl_from_logits(p_base, logp_base, logits)
        if self.used == "chunked":
            return kl_chunked(p_base, logp_base, logits, self.slice_bytes)
        if self._checked:
            return kl_compiled(p_base, logp_base, logits)
        return self._first_compiled(p_base, logp_base, logits)

    def _first_compiled(self, p_base, logp_base, logits) -> torch.Tensor:
        """The first compiled call: built, and checked against ``plain`` on the first position; out-of-memory
        errors propagate (the caller halves its chunk), anything else falls back to ``chunked``."""
        from swapkl.errors import is_oom

        try:
            out = kl_compiled(p_base, logp_base, logits)
            V = logits.shape[-1]
            want = kl_from_logits(p_base.reshape(-1, V)[:1], logp_base.reshape(-1, V)[:1], logits.reshape(-1, V)[:1])
            got = out.reshape(-1)[:1]
            tol = 1e-4 * float(want.abs().max()) + 1e-5  # float32 rounding of ~ln V-sized terms: ~1e-6
            if not bool(torch.isfinite(got).all()) or float((got - want).abs().max()) > tol:
                self._fall_back(f"the compiled KL gave {got.tolist()} where the plain one gives {want.tolist()}")
                return kl_chunked(p_base, logp_base, logits, self.slice_bytes)
        except Exception as e:
            if is_oom(e):
                raise
            self._fall_back(f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return kl_chunked(p_base, logp_base, logits, self.slice_bytes)
        self._checked = True
        return out
