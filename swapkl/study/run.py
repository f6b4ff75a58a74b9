"""Running a study: one model in memory at a time, each finished row written to the study cache at once
(atomically), so a study interrupted after k models resumes at model k + 1 and computes nothing again for the first
k (their rows are read back; an unfinished model resumes from the single-model caches of its scores, curves and
evidence).

The cache of a row: ``<cache>/study/<plan key>/<model key>.json``, a store entry of kind :data:`KIND`, keyed by the
study's contract (:meth:`~swapkl.study.plan.StudyPlan.key`) and the model's spec, revision and content fingerprint
(:func:`~swapkl.model.fingerprint.quick_fingerprint`).  A corrupt entry is warned about and recomputed."""
from __future__ import annotations

import gc
import time
import warnings
from pathlib import Path

from swapkl import __version__
from swapkl.contract import stable_hash
from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.scoring.results import finite_json
from swapkl.store import CacheWarning, CorruptEntry, cache_root, read_entry, write_entry
from swapkl.study.plan import StudyModel, StudyPlan
from swapkl.study.result import StudyResult

KIND = "study-row"
PROC_STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def row_path(plan: StudyPlan, model: StudyModel) -> Path:
    """Where ``model``'s finished row under ``plan`` is cached."""
    from swapkl.model.fingerprint import quick_fingerprint

    fp = quick_fingerprint(model.spec, model.revision)
    key = stable_hash({"spec": model.spec, "revision": model.revision, "fingerprint": fp, "version": __version__})
    return cache_root() / "study" / plan.key() / f"{key[:24]}.json"


def cached_row(plan: StudyPlan, model: StudyModel) -> dict | None:
    """The cached row of ``model`` (its label set to this study's), or None; a corrupt entry: a warning, None."""
    path = row_path(plan, model)
    try:
        row = read_entry(path, KIND)
    except CorruptEntry as e:
        warnings.warn(f"corrupt study cache entry {path}: {e}; this model is analysed again", CacheWarning,
                      stacklevel=2)
        return None
    if row is None:
        return None
    return row | {"model": model.to_dict(), "cached": True}


class PeakMemory:
    """The peak memory of one model's analysis: on CUDA the allocator's peak (bytes allocated at once); on the CPU
    the process's peak resident set (``VmHWM``, reset per model through ``/proc/self/clear_refs``; where that
    cannot be reset, the peak since the process started, labelled so)."""

    def __init__(self, device):
        self.cuda = str(device).startswith("cuda")
        self.what = "CUDA max_memory_allocated"
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(device)
            self.device = device
            return
        try:
            CLEAR_REFS.write_text("5")
            self.what = "peak RSS of this model's analysis (VmHWM, reset per model)"
        except OSError:
            self.what = "peak RSS of the process so far (VmHWM; could not be reset per model)"

    def peak(self) -> int | None:
        if self.cuda:
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            for line in PROC_STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None


def _analyse(plan, model, ev, corpus, load, progress, should_stop) -> dict:
    from swapkl.study.analyze import analyze_model

    t0 = time.perf_counter()
    ck = load(model)
    try:
        mem = PeakMemory(ck.device)
        row = analyze_model(ck, plan, ev, corpus, progress=progress, should_stop=should_stop)
        row["cost"] = {"seconds": time.perf_counter() - t0, "peak_bytes": mem.peak(), "peak_what": mem.what,
                       "device": str(ck.device), "dtype": ck.dtype}
    finally:
        del ck
        gc.collect()
    return row


def run_study(plan: StudyPlan, ev, corpus, load, progress=None, on_row=None, should_stop=None,
              shard: tuple[int, int] | None = None) -> StudyResult:
    """Every model of ``plan`` (its share ``shard`` = (K, N) when given), in order: the cached row, else the
    analysis of ``load(model)`` (a :class:`~swapkl.model.checkpoints.Checkpoint`; one at a time) written to the
    cache as soon as it is finished.  A model that cannot be loaded or analysed (a user error: unknown model,
    too short a text) gets a failed row with the one-line reason and the study goes on; an interruption
    (:class:`~swapkl.errors.ComputeInterrupted`, Ctrl-C) stops it, finished rows kept.  ``progress(k, n, model
    label, done, total, what)``: model k of n and its step; ``on_row(result so far)`` after each row."""
    from swapkl.study.plan import shard as share

    models = share(plan.models, *shard) if shard else list(plan.models)
    for m in models:  # a missing local model is refused before any work
        row_path(plan, m)
    result = StudyResult(contract=plan.contract_dict(), rows=[], shard=list(shard) if shard else None,
                         complete=False)
    for k, model in enumerate(models, 1):
        tell = (lambda d, t, w, k=k, m=model: progress(k, len(models), m.label, d, t, w)) if progress else None
        row = cached_row(plan, model)
        if row is None:
            try:
                row = _analyse(plan, model, ev, corpus, load, tell, should_stop)
            except (ComputeInterrupted, KeyboardInterrupt):
                raise
            except SwapklError as e:
                result.rows.append({"model": model.to_dict(), "status": "failed", "error": str(e).splitlines()[0]})
                if on_row:
                    on_row(result)
                continue
            row = {"status": "done", **row, "model": model.to_dict(), "cached": False}
            row = finite_json(row)
            write_entry(row_path(plan, model), KIND, row)
        elif tell:
            tell(1, 1, "read from the study cache")
        result.rows.append(row)
        if on_row:
            on_row(result)
    result.complete = True
    return result
