"""Running a study: one model in memory at a time, each finished row written to the study cache at once
(atomically), so a study interrupted after k models resumes at model k + 1 and computes nothing again for the first
k (their rows are read back; an unfinished model resumes from the single-model caches of its scores, curves and
evidence).

The cache of a row: ``<cache>/study/<plan key>/<model key>.json``, a store entry of kind :data:`KIND`, keyed by the
study's contract (:meth:`~swapkl.study.plan.StudyPlan.key`) and the model's spec, revision and content fingerprint
(:func:`~swapkl.model.fingerprint.offline_identity`: read from the model's files, so a finished study run again
loads no model; a hub revision the local cache cannot resolve is loaded and keyed by the commit the load
reports).  A corrupt entry is warned about and recomputed."""
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


def row_path(plan: StudyPlan, model: StudyModel, identity: str | None = None) -> Path | None:
    """Where ``model``'s finished row under ``plan`` is cached: keyed by the model's identity from its files
    (:func:`~swapkl.model.fingerprint.offline_identity`, or ``identity`` when a load reported it), so a finished
    row is found without loading the model; None while the identity cannot be known without loading (a hub
    revision the local Hugging Face cache has no ref of)."""
    from swapkl.model.fingerprint import offline_identity

    fp = identity or offline_identity(model.spec, model.revision)
    if fp is None:
        return None
    key = stable_hash({"spec": model.spec, "revision": model.revision, "fingerprint": fp, "version": __version__})
    return cache_root() / "study" / plan.key() / f"{key[:24]}.json"


def loaded_identity(ck) -> str | None:
    """The identity :func:`row_path` keys a loaded checkpoint's row by, where its files could not tell: a hub
    model's commit as the load resolved it (None: unknown, the row is not cached)."""
    from swapkl.model.fingerprint import hub_identity

    ident = ck.identity or {}
    return hub_identity(ident.get("id"), ident.get("commit")) if ident.get("kind") == "hub" else None


def cached_row(plan: StudyPlan, model: StudyModel) -> dict | None:
    """The cached row of ``model`` (its label set to this study's), or None (also while the model's identity needs
    a load); a corrupt entry: a warning, None.  Reads files only: no model is loaded."""
    path = row_path(plan, model)
    if path is None:
        return None
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


def _analyse(plan, model, ev, corpus, load, progress, should_stop) -> tuple[dict, Path | None]:
    """The row of ``load(model)`` and where it is cached (its identity read again after the load)."""
    from swapkl.study.analyze import analyze_model

    t0 = time.perf_counter()
    ck = load(model)
    try:
        mem = PeakMemory(ck.device)
        row = analyze_model(ck, plan, ev, corpus, progress=progress, should_stop=should_stop)
        row["cost"] = {"seconds": time.perf_counter() - t0, "peak_bytes": mem.peak(), "peak_what": mem.what,
                       "device": str(ck.device), "dtype": ck.dtype}
        path = row_path(plan, model) or row_path(plan, model, loaded_identity(ck))
    finally:
        del ck
        gc.collect()
    return row, path


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
                row, path = _analyse(plan, model, ev, corpus, load, tell, should_stop)
            except (ComputeInterrupted, KeyboardInterrupt):
                raise
            except SwapklError as e:
                result.rows.append({"model": model.to_dict(), "status": "failed", "error": str(e).splitlines()[0]})
                if on_row:
                    on_row(result)
                continue
            row = finite_json({"status": "done", **row, "model": model.to_dict(), "cached": False})
            if path is not None:  # an identity known neither from the files nor from the load: not cached
                write_entry(path, KIND, row)
        elif tell:
            tell(1, 1, "read from the study cache")
        result.rows.append(row)
        if on_row:
            on_row(result)
    result.complete = True
    return result
