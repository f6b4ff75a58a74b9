"""The loaded checkpoints a job manager keeps: a small LRU shared by every job (a shared model is never
mutated -- removal uses :func:`swapkl.surgery.prune.pruned_copy`, which shares tensors but not modules).

This is the one place the dashboard's jobs load a model, so it is where the server's policy is checked: every
load, cached or not (:meth:`ModelCache.get`, :meth:`ModelCache.load`), first passes the server's policy
(:meth:`swapkl.jobs.policy.Policy.check_model`; a trajectory's list, before it is read from disk,
:meth:`ModelCache.check_list`), which compares strings only and raises before anything reads the disk or the hub.
A new page or pipeline cannot forget it."""
from __future__ import annotations

import collections
import logging
import threading
from typing import Callable

from swapkl import heavy

log = logging.getLogger("swapkl.jobs")


class ModelCache:
    """At most ``max_models`` loaded checkpoints, least recently used dropped first.  ``loader``: a
    ``load_checkpoint``-compatible callable (None = :func:`swapkl.model.checkpoints.load_checkpoint`; tests pass one);
    ``policy``: the server's :class:`~swapkl.jobs.policy.Policy`, whose refusal stops a load (None: no check)."""

    def __init__(self, max_models: int = 2, loader: Callable | None = None, policy=None):
        self.max_models = max(1, int(max_models))
        self.loader = loader
        self.policy = policy
        self.loads = 0  # models loaded so far (tests count them)
        self._models: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[tuple, threading.Lock] = {}  # key -> held while that key loads

    def get(self, model: str, revision: str | None, dtype: str = "float32", device: str = "auto"):
        """A loaded checkpoint (loaded on a miss).  Callers must not mutate it.  Concurrent calls for one key
        load it once (the others wait for that load): one copy per (model, revision, dtype, device)."""
        self.check(model, revision)
        key = (model, revision, dtype, device)
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._lock:
                if key in self._models:
                    self._models.move_to_end(key)
                    return self._models[key]
            ck = self._load(model, revision, dtype, device)
            with self._lock:
                self._models[key] = ck
                self._models.move_to_end(key)
                self._loading.pop(key, None)
                while len(self._models) > self.max_models:
                    self._models.popitem(last=False)
        return ck

    def load(self, model: str, revision: str | None = None, dtype: str = "float32", device: str = "auto",
             own: bool = False):
        """A checkpoint loaded for one use and not kept (a trajectory holds one checkpoint at a time), through the
        same gate as :meth:`get`.  ``own=True``: a checkpoint the server made itself (the demo trajectory's folders
        under its cache, found by the server, never a request's text), which no allow-list names."""
        if not own:
            self.check(model, revision)
        return self._load(model, revision, dtype, device)

    def check(self, model: str, revision: str | None = None) -> None:
        """Raise :class:`~swapkl.errors.PolicyError` unless the policy lets this server load ``model``."""
        if self.policy is not None:
            self.policy.check_model(model, revision)

    def check_list(self, text: str) -> None:
        """Raise :class:`~swapkl.errors.PolicyError` unless the policy allows a trajectory's checkpoint list (as
        text, before anything reads it from disk)."""
        if self.policy is not None:
            self.policy.check_checkpoint_list(text)

    def _load(self, model: str, revision: str | None, dtype: str, device: str):
        loader = self.loader
        if loader is None:
            from swapkl.model.checkpoints import load_checkpoint as loader  # deferred: imports torch
        with heavy.exclusive():  # loading resolves lazy transformers modules: one thread at a time
            ck = loader(model, revision=revision, dtype=dtype, device=device)
        self.loads += 1
        log.info("model loaded: %s", (model, revision, dtype, device))
        return ck

    def clear(self) -> None:
        """Drop every loaded checkpoint (a study holds one model at a time)."""
        with self._lock:
            self._models.clear()

    def keys(self) -> list[tuple]:
        with self._lock:
            return list(self._models)
