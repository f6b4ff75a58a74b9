"""The memo of perplexity evaluations a removal-curve run shares between methods, budgets and runs."""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from swapkl import __version__
from swapkl.store import CacheWarning, cache_root, warn_unwritable
from swapkl.contract import stable_hash
from swapkl.errors import SwapklError
from swapkl.store import read_entry, write_entry


KIND = "ppl-eval"  # store entries (swapkl.store) of one evaluation


class EvalMemo:
    """Perplexity evaluations keyed by (text key, frozenset of removed layers).

    One instance serves a whole run (all budgets, all methods, SLEB's trial sets); pass the same instance to
    another :func:`removal_curves` call on the same model and text to reuse it across calls.  With ``disk`` (a
    folder, see :func:`disk_memo`) every evaluation is also written there atomically as it finishes and read
    back by later runs, so an interrupted curves run loses nothing (a folder that cannot be written is warned about
once, :func:`swapkl.store.warn_unwritable`, and the memo goes on in memory).  ``hits``/``misses`` count lookups
    (``disk_hits`` those served from the folder)."""

    def __init__(self, fingerprint: object = None, disk: str | os.PathLike | None = None):
        self.fingerprint = fingerprint
        self.store: dict = {}
        self.hits = 0
        self.misses = 0
        self.disk_hits = 0
        self.seconds = 0.0
        self.disk = Path(disk) if disk is not None else None
        self.disk_writable = True  # False after the first failed write (the rest stays in memory)

    def bind(self, fingerprint: object) -> None:
        """Tie the memo to one model and text: the first run's ``fingerprint`` is kept, another one raises
        :class:`SwapklError` (the memo's evaluations would belong to another model or text)."""
        if self.fingerprint is None:
            self.fingerprint = fingerprint
        elif self.fingerprint != fingerprint:
            raise SwapklError("this evaluation memo belongs to another model or text; use a new EvalMemo")

    def _file(self, key) -> Path:
        return self.disk / f"{stable_hash([key[0], sorted(key[1])])[:24]}.json"

    def _load(self, key):
        from swapkl.measure.evaluate import PPLResult  # deferred: pulls torch; the CLI and the dashboard import this module without it

        f = self._file(key)
        try:
            d = read_entry(f, KIND)
            if d is None:
                return None
            if d["text_key"] != key[0] or sorted(d["removed"]) != sorted(key[1]):
                raise ValueError("key mismatch")
            return PPLResult(nll=np.asarray(d["window_nll"], float), counts=np.asarray(d["window_counts"], np.int64),
                             n_tokens=int(d["n_tokens"]), window=int(d["window"]), stride=int(d["stride"]),
                             drop_first_target=bool(d["drop_first_target"]),
                             kl=np.asarray(d["window_kl"], float) if d.get("window_kl") is not None else None,
                             seconds=float(d.get("seconds", 0.0)))
        except (OSError, ValueError, KeyError, TypeError) as e:  # CorruptEntry is a ValueError
            warnings.warn(f"corrupt cache entry {f}: {e}; it will be recomputed", CacheWarning, stacklevel=3)
            with contextlib.suppress(OSError):
                f.unlink(missing_ok=True)
            return None

    def _save(self, key, val) -> None:
        if not self.disk_writable:
            return
        d = val.to_dict(with_windows=True) | {"text_key": key[0], "removed": sorted(key[1])}
        try:
            write_entry(self._file(key), KIND, d)
        except OSError as e:  # an unwritable cache: say so once, keep going in memory
            self.disk_writable = False
            warn_unwritable(self._file(key), e)

    def peek(self, text_key: str, removed: Iterable[int]):
        """The stored evaluation (memory, then the folder) or None; never computes, counts nothing."""
        key = (text_key, frozenset(int(i) for i in removed))
        if key in self.store:
            return self.store[key]
        val = self._load(key) if self.disk is not None else None
        if val is not None:
            self.store[key] = val
        return val

    def get(self, text_key: str, removed: Iterable[int], compute: Callable[[], object]):
        key = (text_key, frozenset(int(i) for i in removed))
        if key in self.store:
            self.hits += 1
            return self.store[key]
        if self.disk is not None:
            val = self._load(key)
            if val is not None:
                self.hits += 1
                self.disk_hits += 1
                self.store[key] = val
                return val
        self.misses += 1
        t = time.perf_counter()
        val = compute()
        self.seconds += time.perf_counter() - t
        self.store[key] = val
        if self.disk is not None:
            self._save(key, val)
        return val


def disk_memo(identity: dict | None, kl: bool = True) -> EvalMemo:
    """An :class:`EvalMemo` backed by ``<cache>/ppl/<key>/``, keyed by the model identity (id + revision +
    commit, or content fingerprint), whether KL to base is recorded, and the swapkl version; a plain in-memory
    memo when the identity cannot name the weights."""

    ident = {k: (identity or {}).get(k) for k in ("kind", "id", "revision", "commit", "fingerprint", "dtype")}
    if not (ident["fingerprint"] or ident["commit"] or (ident["kind"] == "hub" and ident["revision"])):
        return EvalMemo()
    key = stable_hash({"model": ident, "kl": bool(kl), "version": __version__})[:20]
    return EvalMemo(disk=cache_root() / "ppl" / key)
