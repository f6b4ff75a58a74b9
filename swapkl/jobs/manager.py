"""The job manager: one worker thread running queued jobs one at a time, identical requests sharing one job,
the loaded-model LRU, snapshots of finished jobs, opened files and exports (no Streamlit here)."""
from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from swapkl.cache import cache_root
from swapkl.contract import Contract, stable_hash
from swapkl.curves import CurvesResult, check_same_model
from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.policy import PolicyError
from swapkl.results import SwapResult
from swapkl.schema import parse_json

from . import pipelines
from .failures import readable_error
from .job import CANCELLED, DONE, ERROR, QUEUED, Job
from .models import ModelCache
from .requests import AnalysisRequest, request_key
from .snapshots import SnapshotStore

log = logging.getLogger("swapkl.jobs")


class JobManager:
    """Runs jobs one at a time on a daemon worker thread (two jobs on one CPU only slow each other down).

    ``max_models``: loaded checkpoints kept (LRU); ``root``: snapshot folder (default
    ``<cache>/dashboard``); ``log_path``: where tracebacks go (default ``<cache>/logs/dashboard.log``);
    ``loader``: ``load_checkpoint``-compatible callable (tests); ``progress_dir``: a folder the browser can read
    (the dashboard's static folder) where every job keeps ``<key>.json`` = :meth:`Job.progress_dict` current."""

    def __init__(self, max_models: int = 2, root: str | Path | None = None, log_path: str | Path | None = None,
                 loader: Callable | None = None, use_snapshots: bool = True, progress_dir: str | Path | None = None):
        self.root = Path(root) if root is not None else cache_root() / "dashboard"
        self.snapshots = SnapshotStore(self.root)
        self.log_path = Path(log_path) if log_path is not None else cache_root() / "logs" / "dashboard.log"
        self.models = ModelCache(max_models, loader)
        self.use_snapshots = use_snapshots
        self.progress_dir = Path(progress_dir) if progress_dir is not None else None
        if self.progress_dir is not None:
            try:
                self.progress_dir.mkdir(parents=True, exist_ok=True)
                for f in self.progress_dir.glob("*.json"):  # other servers' files, left from earlier days
                    if time.time() - f.stat().st_mtime > 86400:
                        f.unlink(missing_ok=True)
            except OSError as e:
                log.warning("no progress files (%s): the pages poll the server instead", e)
                self.progress_dir = None
        self._jobs: dict[str, Job] = {}
        self._order: list[str] = []
        self._lock = threading.RLock()
        self._queue: collections.deque = collections.deque()
        self._wake = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self._closed = False
        self._setup_log()

    def _setup_log(self) -> None:
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            if not any(getattr(h, "baseFilename", None) == str(self.log_path.resolve()) for h in log.handlers):
                h = logging.FileHandler(self.log_path, encoding="utf-8")
                h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
                log.addHandler(h)
                log.setLevel(logging.INFO)
        except OSError:  # a read-only cache: no log file, errors still show
            pass

    # ---------------------------------------------------------------- public API
    def warm_up(self) -> threading.Thread:
        """Import the heavy modules (torch, transformers, the engine) on a daemon thread, so that the first
        Compute of a freshly started server does not wait for them (~3-4 s on 2 cores)."""
        def _imports():
            try:
                import swapkl.api
                import swapkl.curves  # noqa: F401
            except Exception as e:  # the job that needs them reports the real error
                log.warning("warm-up import failed: %s", e)

        t = threading.Thread(target=_imports, name="swapkl-warm-up", daemon=True)
        t.start()
        return t

    def submit(self, request, owner: str | None = None, max_active: int | None = None) -> Job:
        """The job for ``request``: the existing one when an identical request is queued, running or done
        (a failed or cancelled one is retried), else a new job -- finished at once from a snapshot when one
        exists, otherwise queued for the worker.

        ``owner`` (a browser session) is recorded as the job's submitter; ``max_active``: a new job is refused
        with :class:`~swapkl.policy.PolicyError` while that owner already has this many queued or running
        (demo mode: one visitor cannot occupy the machine).  Joining an identical existing job costs nothing."""
        try:
            key = request_key(request)
        except SwapklError as e:  # a bad path or checkpoint list: a job that failed at once
            key = "invalid-" + stable_hash(request.to_dict())[:12]
            job = Job(key, request)
            job.finish(ERROR, *readable_error(e, "reading the model spec", None))
            with self._lock:
                self._remember(job)
            return job
        with self._lock:
            old = self._jobs.get(key)
            if old is not None and old.status not in (ERROR, CANCELLED):
                return old
            if max_active is not None and owner is not None:
                mine = [j for j in self._jobs.values() if j.submitter == owner and j.running]
                if len(mine) >= max_active:
                    raise PolicyError(f"you already have {len(mine)} computation{'s' * (len(mine) != 1)} queued "
                                      f"or running (at most {max_active} on this server): wait for "
                                      f"{'it' if len(mine) == 1 else 'one'} to finish or cancel it")
            job = Job(key, request)
            job.submitter = owner
            if self.progress_dir is not None:
                job.progress_path = self.progress_dir / f"{key}.json"
            self._remember(job)
            if self.use_snapshots and self.snapshots.load(job):
                return job
            self._queue.append(job)
            self._ensure_worker()
            self._wake.notify_all()
        job.note("queued")
        return job

    def open_files(self, result_json: str | bytes | dict, curves_json: str | bytes | dict | None = None,
                   owner: str | None = None) -> Job:
        """A finished analysis job from saved files -- a ``score --json`` result (e.g. the merged result of a
        cluster run) and optionally a ``curves --json`` file -- so the pages can browse it on a machine that
        has neither the model nor the cache.  Raises :class:`SwapklError` for a file that is not a result or
        curves from another model.  ``owner``: the browser session that opened it; only that session sees the
        job (:meth:`jobs` with ``viewer``), it never becomes another visitor's "last analysis"."""
        def as_dict(x, what):  # size, depth and NaN limits; from_json checks every field (swapkl.schema)
            return x if isinstance(x, dict) else parse_json(x, what, keep_constants=True)

        rd = as_dict(result_json, "result file")
        result = SwapResult.from_json(rd)
        curves = None
        if curves_json is not None:
            try:
                curves = CurvesResult.from_json(as_dict(curves_json, "curves file"))
            except (TypeError, KeyError) as e:
                raise SwapklError(f"not a swapkl curves file ({e})") from e
            check_same_model(result, curves.model)
        ident = result.identity or {}
        model = str(ident.get("id") or ident.get("display") or "result file")
        budget = int(curves.budget) if curves is not None else 0
        methods = tuple(curves.methods) if curves is not None else ()
        request = AnalysisRequest(model=model, revision=ident.get("revision") if ident.get("kind") == "hub" else None,
                                  contract=Contract.from_dict(result.contract), budget=budget, methods=methods,
                                  evaluator=curves.evaluator if curves is not None else None)
        key = "file-" + stable_hash({"result": rd, "curves": None if curves is None else curves.to_dict(),
                                     "owner": owner})[:16]
        with self._lock:
            old = self._jobs.get(key)
            if old is not None:
                return old
            job = Job(key, request)
            job.owner = owner
            job.done_from("opened from file", result=result, curves=curves)
            self._remember(job)
        return job

    def get(self, key: str | None, viewer: str | None = None) -> Job | None:
        """The job ``key``; with ``viewer``, None for another session's private job."""
        with self._lock:
            job = self._jobs.get(key) if key else None
        if job is not None and viewer is not None and job.owner not in (None, viewer):
            return None
        return job

    def find(self, request) -> Job | None:
        """The job of an identical request, if any (without submitting)."""
        try:
            key = request_key(request)
        except SwapklError:
            return None
        return self.get(key)

    def jobs(self, viewer: str | None = None) -> list[Job]:
        """The jobs ``viewer`` (a browser session; None = every job) may see, newest first: every shared job
        plus the private ones (opened files) it owns."""
        with self._lock:
            out = [self._jobs[k] for k in reversed(self._order)]
        if viewer is None:
            return out
        return [j for j in out if j.owner is None or j.owner == viewer]

    def active(self) -> list[Job]:
        return [j for j in self.jobs() if j.running]

    def cancel(self, key: str) -> bool:
        """Ask a job to stop (a queued job is cancelled at once).  Returns whether the job was active."""
        job = self.get(key)
        if job is None or not job.running:
            return False
        job.request_cancel()
        with self._lock:
            if job.status == QUEUED and job in self._queue:
                self._queue.remove(job)
                job.finish(CANCELLED, "cancelled before it started")
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel everything and stop the worker (tests)."""
        with self._lock:
            self._closed = True
            for j in self._jobs.values():
                if j.running:
                    j.request_cancel()
            self._wake.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    def checkpoint_for(self, model: str, revision: str | None, dtype: str = "float32", device: str = "auto"):
        """A loaded checkpoint from the LRU (:class:`~swapkl.jobs.models.ModelCache`; loaded on a miss).
        Callers must not mutate it."""
        return self.models.get(model, revision, dtype, device)

    def loaded_models(self) -> list[tuple]:
        return self.models.keys()

    @property
    def _loader(self):  # tests swap the loader
        return self.models.loader

    @_loader.setter
    def _loader(self, fn) -> None:
        self.models.loader = fn

    def export_pruned(self, job: Job, removed, out_dir: str | Path, force: bool = False, merge=None) -> Path:
        """Save the job's model with layers ``removed`` deleted to ``out_dir`` (:func:`swapkl.prune.save_pruned`;
        the shared model is not changed; an existing non-empty folder needs ``force``).  ``merge``: a LaCo-style
        merged model instead (``{"groups": [[3, 4], ...], "mode": "average" | "laco"}``).  Returns the folder."""
        from swapkl.prune import save_pruned  # deferred: torch

        req = job.request
        ck = self.checkpoint_for(req.model, req.revision, req.contract.dtype, req.contract.device)
        return save_pruned(ck.model, None if merge else list(removed), out_dir, tokenizer=ck.tokenizer,
                           identity=ck.identity, force=force, merge=merge)

    # ---------------------------------------------------------------- internals
    def _remember(self, job: Job) -> None:
        if job.key in self._jobs:
            self._order.remove(job.key)
        self._jobs[job.key] = job
        self._order.append(job.key)

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._loop, name="swapkl-jobs", daemon=True)
            self._worker.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait(1.0)
                if self._closed and not self._queue:
                    return
                job = self._queue.popleft()
            self._run(job)

    def _run(self, job: Job) -> None:
        if not job.start():
            return
        try:
            if job.request.kind == "trajectory":
                pipelines.run_trajectory(job)
            else:
                pipelines.run_analysis(job, self.models)
            if self.use_snapshots:
                self.snapshots.save(job)
            job.finish(DONE)
        except ComputeInterrupted as e:
            partial = getattr(e, "partial", None)
            if partial is not None and job.request.kind == "analysis" and hasattr(partial, "methods"):
                job.curves = partial
            job.finish(CANCELLED, "cancelled; finished pairs are kept in the cache")
        except BaseException as e:  # every failure becomes one readable line, the app goes on
            phase = job.progress().phase
            msg, kind = readable_error(e, phase, self.log_path)
            if kind != "user":
                log.error("job %s (%s) failed while %s:\n%s", job.key, job.request.label(), phase,
                          traceback.format_exc())
            else:
                log.info("job %s: %s", job.key, msg)
            job.finish(ERROR, msg, kind)
