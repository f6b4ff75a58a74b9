"""The batch size of the engine's calls: at most ``max_rows`` prompt rows per call, halved on out-of-memory and
retried (:class:`BatchController`), and the error when even one row does not fit (:class:`DeviceOutOfMemory`).
Used by :mod:`swapkl.scoring.slots`, the engine and the bridged sweep."""
from __future__ import annotations

import inspect
from typing import Callable

import torch

from swapkl.errors import SwapklError, is_oom


class DeviceOutOfMemory(SwapklError):
    """Out of memory although the batch was already down to one prompt row (halving cannot help)."""


def free_cached_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class BatchController:
    """Holds the current maximum batch (rows of prompts per call) and halves it on out-of-memory.

    ``retries`` records every halving as ``{"where", "from", "to"}`` so callers can report it;
    ``on_retry(record)`` is called at each one.  ``fault`` is a test hook: ``fault(rows)`` or
    ``fault(rows, where)`` (``where`` in {"baseline", "block", "kl"}) is called before each call and may raise
    to simulate an out-of-memory error.  An out-of-memory error at one row raises :class:`DeviceOutOfMemory`.
    """

    def __init__(self, max_rows: int, fault: Callable | None = None, where: str = "block",
                 on_retry: Callable[[dict], None] | None = None, retries: list | None = None):
        self.max_rows = max(1, int(max_rows))
        self.retries: list[dict] = retries if retries is not None else []
        self.where = where
        self.on_retry = on_retry
        self.fault = fault
        self._fault_where = False
        if fault is not None:
            try:
                self._fault_where = len(inspect.signature(fault).parameters) >= 2
            except (TypeError, ValueError):
                self._fault_where = False

    def _check_fault(self, rows: int, where: str) -> None:
        if self.fault is None:
            return
        if self._fault_where:
            self.fault(rows, where)
        elif where == "block":  # one-argument hooks only ever targeted block calls
            self.fault(rows)

    def map(self, fn: Callable[[int, int], object], n: int, where: str | None = None,
            detail: str = "") -> list:
        """``[fn(a, b) for consecutive row ranges [a, b) covering 0..n]`` with ranges of at most ``max_rows``
        rows; an out-of-memory error halves ``max_rows`` and retries the failed range (finished ranges are
        kept: every row is independent of the others)."""
        where = where or self.where
        outs, k = [], 0
        while k < n:
            m = min(self.max_rows, n - k)
            try:
                self._check_fault(m, where)
                outs.append(fn(k, k + m))
                k += m
            except Exception as e:  # only out-of-memory is retried
                if not is_oom(e):
                    raise
                free_cached_memory()
                if m == 1:
                    raise DeviceOutOfMemory(
                        f"out of memory even at batch 1 ({where}{detail}): {str(e).splitlines()[0][:160]}; "
                        "try --dtype bfloat16, fewer --tokens, or --device-map auto (spread over several GPUs)"
                    ) from e
                rec = {"where": where, "from": self.max_rows, "to": max(1, m // 2)}
                self.max_rows = rec["to"]
                self.retries.append(rec)
                if self.on_retry is not None:
                    self.on_retry(rec)
        return outs

    def halve_group(self, n: int, where: str = "live") -> int:
        """A group of ``n`` items run together (a sweep's chunk of pairs, each alive as several row sets) ran out
        of memory although every call was already down to one row: the next group size, ``n // 2`` (at least 1),
        recorded and reported like a row halving, with the cached memory freed.  ``n == 1`` cannot shrink:
        :class:`DeviceOutOfMemory`."""
        if n <= 1:
            raise DeviceOutOfMemory(f"out of memory with one item alive ({where}); try --dtype bfloat16, fewer "
                                    "--tokens, or --device-map auto (spread over several GPUs)")
        rec = {"where": where, "from": n, "to": max(1, n // 2)}
        self.retries.append(rec)
        if self.on_retry is not None:
            self.on_retry(rec)
        free_cached_memory()
        return rec["to"]

    def run(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, where: str | None = None) -> torch.Tensor:
        """``fn`` applied to ``x`` in chunks of at most ``max_rows`` rows (dim 0), halving on OOM."""
        outs = self.map(lambda a, b: fn(x[a:b]), x.shape[0], where)
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)

    def run_rows(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor, num_prompts: int,
                 where: str | None = None) -> torch.Tensor:
        """:meth:`run` for ``x`` made of row sets of all ``num_prompts`` prompts: ``fn(part, rows)`` gets each
        part's prompt indices (row r of ``x`` is prompt ``r mod num_prompts``)."""
        def part(a: int, b: int) -> torch.Tensor:
            return fn(x[a:b], torch.arange(a, b) % num_prompts)

        outs = self.map(part, x.shape[0], where)
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)
