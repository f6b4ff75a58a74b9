"""The lm-eval task runner (docs/tasks.md): one run's loaded tasks evaluated on variants of one model -- the base,
a pruned copy, a merged copy, a bridged copy (or, in :mod:`swapkl.healing.tasks`, a healed one) -- through
lm-evaluation-harness itself (:func:`swapkl.measure.lmeval.evaluate`: ``simple_evaluate`` on an ``HFLM`` around the
in-memory model), every variant's rows cached per (model weights, removed set, task, task version and configuration,
limit, few-shot count, lm-eval version) through :mod:`swapkl.store` (kind ``lm-eval-task``).  Which sets are
evaluated is the caller's: :func:`swapkl.removal.tasks.task_accuracy` (after removal) and
:func:`swapkl.healing.tasks.heal_task_accuracy` (after healing) share this runner, its keys and its cache.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Sequence

from swapkl.contract import stable_hash
from swapkl.errors import ComputeInterrupted
from swapkl.measure import lmeval
from swapkl.store import CorruptEntry, cache_root, read_entry, warn_unwritable, write_entry

STORE_KIND = "lm-eval-task"


@dataclass(frozen=True)
class TaskSettings:
    """How a :class:`TaskRunner` runs lm-eval (and :func:`swapkl.removal.tasks.task_accuracy` with it): ``tasks``
    (lm-eval task or group names: hub tasks, or tasks from YAML files under ``include_path``), ``limit`` (examples
    per task; None = all), ``num_fewshot`` (None = the task's default), ``batch_size`` (lm-eval's), ``use_cache``
    (the per-variant disk cache) and ``share_prefix`` (variants start from the base model's hidden states entering
    their first removed layer, :mod:`swapkl.measure.prefix`: the same numbers, fewer blocks run)."""

    tasks: tuple
    include_path: str | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    batch_size: int = 16
    use_cache: bool = True
    share_prefix: bool = True


def _cache_key(identity: dict | None) -> dict | None:
    ident = {k: (identity or {}).get(k) for k in ("kind", "id", "revision", "commit", "fingerprint", "dtype")}
    if not (ident["fingerprint"] or ident["commit"] or (ident["kind"] == "hub" and ident["revision"])):
        return None  # the identity does not name the weights: nothing is cached
    return ident


class TaskRunner:
    """One run: the loaded tasks, the variants evaluated so far (a set chosen by two methods is evaluated once),
    the disk cache and the counters.  ``hooks``: the run's ``progress(done, total, message)`` and ``should_stop()``
    (a :class:`~swapkl.removal.plan.RunHooks`, or any object with those two attributes); ``total``: the variants
    :meth:`tick` counts to.  A subclass changes how a variant is built (:meth:`_build`; healing's healed models)."""

    def __init__(self, model, tokenizer, tasks: list[dict], tm, *, identity, settings: TaskSettings, hooks,
                 total: int):
        self.model, self.tok, self.tasks, self.tm = model, copy.deepcopy(tokenizer), tasks, tm
        self.limit, self.num_fewshot, self.batch_size = settings.limit, settings.num_fewshot, settings.batch_size
        self.ident = _cache_key(identity) if settings.use_cache else None
        self.progress, self.should_stop = hooks.progress, hooks.should_stop
        self.done, self.total = 0, total
        self.on_partial, self.result = None, None
        self.memo: dict = {}
        self.bridger = None  # a repair.bridger.Bridger: variant(..., bridged=True) evaluates the bridged model
        self.prefix = None  # a measure.prefix.PrefixStore when variants share the base's hidden states
        self.record_base = False  # evaluate the base model even when its rows are cached (to record its states)
        self.stats = {"evaluations": 0, "cache_hits": 0, "variants": 0, "eval_seconds": 0.0}
        self.lm_eval_version = lmeval.lm_eval_version()

    def _path(self, removed, merge, task, bridged=False):
        key = {"model": self.ident, "removed": list(removed), "merge": merge, "task": task["name"],
               **({"bridge": self.bridger.key()} if bridged else {}),
               "versions": task["versions"], "config_sha": task["config_sha"], "limit": self.limit,
               "num_fewshot": self.num_fewshot, "lm_eval": self.lm_eval_version}
        return cache_root() / "tasks" / f"{stable_hash(key)[:24]}.json"

    def variant(self, removed: Sequence[int], merge: dict | None = None, bridged: bool = False) -> dict:
        """``{"metrics", "stderr", "versions", "n-shot", "n-samples", "docs"}`` merged over the run's tasks for the model
        without ``removed`` (or merged by ``merge``; ``bridged``: with the bridger's bridges in place)."""
        removed = sorted(int(i) for i in removed)
        key = (tuple(removed), repr(merge), bridged)
        if key in self.memo:
            return self.memo[key]
        if self.should_stop is not None and self.should_stop():
            raise ComputeInterrupted("task evaluation stopped")
        out = {"metrics": {}, "stderr": {}, "versions": {}, "n-shot": {}, "n-samples": {}, "docs": {}}
        pm = None
        for task in self.tasks:
            path = self._path(removed, merge, task, bridged) if self.ident else None
            rows = self._read(path)
            if rows is not None and not removed and merge is None and self.record_base:
                rows = None  # run the base anyway: variants to evaluate start from the states it records
            if rows is None:
                if pm is None:  # a bridged model changes block i-1 (folded): it shares no prefix with the base
                    pm = self.bridger.bridged(removed) if bridged else self._build(removed, merge)
                t0 = time.perf_counter()
                rows = lmeval.evaluate(pm, self.tok, task, self.tm, limit=self.limit, num_fewshot=self.num_fewshot,
                                       batch_size=self.batch_size)
                self.stats["eval_seconds"] += time.perf_counter() - t0
                self.stats["evaluations"] += 1
                self._write(path, rows)
            else:
                self.stats["cache_hits"] += 1
            for k in out:
                out[k].update(rows.get(k, {}))
        self.stats["variants"] += 1
        self.memo[key] = out
        return out

    def worth_recording(self, sets: list) -> bool:
        """Whether the base model should run although its rows are cached: at least two of ``sets`` share a prefix
        with it (first removed layer > 0) and are not cached for every task."""
        if self.prefix is None or not self.prefix.layers or not self.ident:
            return False
        todo = {tuple(sorted(s)) for s in sets if min(s) > 0
                and any(self._read(self._path(sorted(s), None, t)) is None for t in self.tasks)}
        return len(todo) >= 2

    def _build(self, removed, merge):
        from swapkl.surgery.blocks import pruned_copy  # deferred: torch
        from swapkl.surgery.merge import merged_copy

        if merge is not None:
            return merged_copy(self.model, merge["groups"], merge["mode"])
        if not removed:
            return self.prefix.recording(self.model) if self.prefix is not None else self.model
        pm = pruned_copy(self.model, removed)
        if self.prefix is not None:
            self.prefix.attach(pm, removed)
        return pm

    def _read(self, path):
        if path is None:
            return None
        try:
            rows = read_entry(path, STORE_KIND)
        except CorruptEntry:
            return None
        return rows if isinstance(rows, dict) and "docs" in rows else None  # without per-document scores: again

    def _write(self, path, rows):
        if path is None:
            return
        try:
            write_entry(path, STORE_KIND, rows)
        except OSError as e:
            warn_unwritable(path, e)

    def tick(self, msg: str):
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total, msg)
        if self.on_partial is not None:
            self.on_partial(self.result)
