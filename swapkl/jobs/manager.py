"""The job manager: one worker thread running queued jobs one at a time, identical requests sharing one job,
the loaded-model LRU, snapshots of finished jobs, opened files and exports (no Streamlit here)."""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from swapkl import heavy
from swapkl.store import cache_root
from swapkl.contract import stable_hash
from swapkl.errors import SwapklError
from swapkl.jobs.policy import Policy, PolicyError

from .audience import Audience
from .export_job import gone as export_gone
from .failures import readable_error
from .job import CANCELLED, ERROR, QUEUED, Job
from .models import ModelCache
from .opened import OpenedLRU, opened_job
from .requests import request_key
from .runner import run_job
from .snapshots import SnapshotStore

log = logging.getLogger("swapkl.jobs")


def _file_log(path: Path) -> None:
    """Send this package's log (tracebacks of failed jobs) to ``path`` once; a read-only cache: no file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not any(getattr(h, "baseFilename", None) == str(path.resolve()) for h in log.handlers):
            h = logging.FileHandler(path, encoding="utf-8")
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            log.addHandler(h)
            log.setLevel(logging.INFO)
    except OSError:
        pass


def _progress_folder(folder) -> Path | None:
    """The browser-readable folder of the jobs' progress files (stale ones, older than a day, removed), or
    None when it cannot be written (the pages then poll the server)."""
    if folder is None:
        return None
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for f in folder.glob("*.json"):  # other servers' files, left from earlier days
            if time.time() - f.stat().st_mtime > 86400:
                f.unlink(missing_ok=True)
    except OSError as e:
        log.warning("no progress files (%s): the pages poll the server instead", e)
        return None
    return folder


def import_job_modules() -> None:
    """Import what a job runs besides torch and transformers: swapkl's engine and removal curves."""
    import swapkl.scoring.score
    import swapkl.removal.curves  # noqa: F401


def warm_up() -> threading.Thread:
    """Import the heavy modules (torch, transformers and the classes loading a model resolves, then swapkl's
    engine and curves) on a daemon thread, once per process and under the import lock of
    :mod:`swapkl.heavy`: the first Compute of a freshly started server does not wait for them, and a job that
    starts meanwhile waits for them instead of racing them (transformers' first imports are not safe to run from
    two threads at once)."""
    return heavy.start_background(then=import_job_modules)


def admit(jobs, owner: str | None, max_active: int | None, max_total: int | None, client: str | None = None,
          max_client: int | None = None) -> None:
    """Refuse a new computation (:class:`~swapkl.jobs.policy.PolicyError`) when ``owner`` already has ``max_active``
    queued or running, its client address ``client`` has ``max_client`` (over all its browser sessions), or the
    server has ``max_total`` queued or running (demo mode bounds all three; joining an identical existing job is not
    a new computation and is never refused)."""
    active = [j for j in jobs if j.running]
    if max_client is not None and client is not None:
        theirs = [j for j in active if j.client == client]
        if len(theirs) >= max_client:
            raise PolicyError(f"your address already has {len(theirs)} computations queued or running (at most "
                              f"{max_client} per address on this server): wait for one to finish or cancel it")
    if max_active is not None and owner is not None:
        mine = [j for j in active if j.submitter == owner]
        if len(mine) >= max_active:
            raise PolicyError(f"you already have {len(mine)} computation{'s' * (len(mine) != 1)} queued "
                              f"or running (at most {max_active} on this server): wait for "
                              f"{'it' if len(mine) == 1 else 'one'} to finish or cancel it")
    if max_total is not None and len(active) >= max_total:
        raise PolicyError(f"the server is busy: {len(active)} computations are queued or running (at most "
                          f"{max_total}); yours was not queued. Try again in a few minutes, or pick a contract "
                          "that is already computed (cached results show at once)")


def renumber(queue, running: bool) -> None:
    """Tell every queued job its place: ``queue_place`` = computations ahead of it (the running one included)."""
    for k, j in enumerate(queue):
        j.queue_place = k + int(running)


def lower_priority(nice: int | None) -> None:
    """Give the calling thread (the worker; torch's intra-op threads, which it starts, inherit it) a lower CPU
    priority (Linux: ``setpriority`` on the thread id), so that the web server's event loop and the pages'
    script runs go first when the machine is busy: the computation takes what they leave.  None: unchanged."""
    if not nice:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), int(nice))
    except (AttributeError, OSError) as e:  # not Linux, or not allowed: run at the normal priority
        log.info("job worker priority unchanged: %s", e)


def busy(jobs: dict) -> bool:
    """Whether one of ``jobs`` (key -> Job) is running (the worker runs one at a time)."""
    return any(j.status == "running" for j in jobs.values())


def work(mgr: JobManager) -> None:
    """The worker thread of ``mgr``: take the next queued job, tell the others their place, run it; until shutdown."""
    lower_priority(mgr.nice)
    while True:
        with mgr._lock:
            while not mgr._queue and not mgr._closed:
                mgr._wake.wait(1.0)
            if mgr._closed and not mgr._queue:
                return
            job = mgr._queue.popleft()
            renumber(mgr._queue, True)
            for j in mgr._queue:
                j.publish(force=True)
        mgr._run(job)


def monitor(mgr: JobManager, every_s: float = 2.0) -> None:
    """Every ``every_s`` seconds: cancel the jobs nobody waits for any more (:class:`Audience`), once each (a running
    job stops at its next check, which may be seconds away on a busy machine)."""
    while not mgr._closed:
        for job in mgr.active():
            if not job.cancel_requested and mgr.audience.abandoned(job.key):
                job.note("cancelled: every browser session that waited for it has left")
                log.info("job %s: cancelled, nobody waits for it", job.key)
                mgr.cancel(job.key, reason="cancelled: everybody who waited for it has left")
        time.sleep(every_s)


class JobManager:
    """Runs jobs one at a time on a daemon worker thread (two jobs on one CPU only slow each other down).

    ``max_models``: loaded checkpoints kept (LRU); ``root``: snapshot folder (default
    ``<cache>/dashboard``); ``log_path``: where tracebacks go (default ``<cache>/logs/dashboard.log``);
    ``loader``: ``load_checkpoint``-compatible callable (tests); ``progress_dir``: a folder the browser can read
    (the dashboard's static folder) where every job keeps ``<key>.json`` = :meth:`Job.progress_dict` current;
    ``policy``: the server's :class:`~swapkl.jobs.policy.Policy` (None: a local server's, which refuses nothing)."""

    def __init__(self, max_models: int = 2, root: str | Path | None = None, log_path: str | Path | None = None,
                 loader: Callable | None = None, use_snapshots: bool = True, progress_dir: str | Path | None = None,
                 alive: Callable[[str], bool] | None = None, grace_s: float = 15.0, nice: int | None = None,
                 policy: Policy | None = None):
        self.policy = policy if policy is not None else Policy()
        self.root = Path(root) if root is not None else cache_root() / "dashboard"
        self.snapshots = SnapshotStore(self.root)
        self.log_path = Path(log_path) if log_path is not None else cache_root() / "logs" / "dashboard.log"
        self.models = ModelCache(max_models, loader, policy=self.policy)
        self.audience = Audience(alive, grace_s)
        self.nice = nice
        self.use_snapshots = use_snapshots
        self.progress_dir = _progress_folder(progress_dir)
        self._jobs: dict[str, Job] = {}
        self._order: list[str] = []
        self.opened = OpenedLRU(self.policy.max_opened)  # opened files kept per session, least recently used out
        self._lock = threading.RLock()
        self._queue: collections.deque = collections.deque()
        self._wake = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self._monitor: threading.Thread | None = None
        self._closed = False
        _file_log(self.log_path)

    # ---------------------------------------------------------------- public API
    warm_up = staticmethod(warm_up)  # the module function, also as a method

    def submit(self, request, owner: str | None = None, max_active: int | None = None,
               max_total: int | None = None, client: str | None = None) -> Job:
        """The job for ``request``: the existing one when an identical request is queued, running or done
        (a failed or cancelled one is retried, and so is a finished export whose files are gone), else a new job -- finished at once from a snapshot when one
        exists, otherwise queued for the worker.

        ``owner`` (a browser session) is recorded as the job's submitter; ``max_active`` / ``max_total``: a new
        job is refused with :class:`~swapkl.jobs.policy.PolicyError` while that owner / the whole server already has
        this many queued or running (demo mode: one visitor cannot occupy the machine, a room cannot queue
        without bound; :func:`admit`).  Joining an identical existing job costs nothing.  A queued job knows
        its place (``Job.queue_place``: computations ahead of it).

        The server's policy is checked first, before the request's model is fingerprinted or anything else reads
        the disk (:meth:`~swapkl.jobs.policy.Policy.check_request`: a refusal raises); on a demo server the
        policy's bounds apply when the caller passes none, ``client`` (the browser's address) is bounded over all
        its sessions, and the job gets the policy's wall-time limit."""
        pol = self.policy
        pol.check_request(request)
        if pol.demo:
            max_active = pol.max_jobs_per_session if max_active is None else max_active
            max_total = pol.max_queued if max_total is None else max_total
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
            if old is not None and old.status not in (ERROR, CANCELLED) and not export_gone(old):
                return old
            admit(self._jobs.values(), owner, max_active, max_total, client,
                  pol.max_jobs_per_client if pol.demo else None)
            job = Job(key, request)
            job.submitter, job.client, job.time_limit = owner, client, pol.job_seconds
            if self.progress_dir is not None:
                job.progress_path = self.progress_dir / f"{key}.json"
            self._remember(job)
            if self.use_snapshots and self.snapshots.load(job):
                return job
            self._queue.append(job)
            renumber(self._queue, busy(self._jobs))
            self._ensure_worker()
            self._wake.notify_all()
        job.note("queued")
        job.publish(force=True)
        return job

    def watch(self, key: str, session: str) -> None:
        """Browser session ``session`` waits for job ``key`` (see :class:`~swapkl.jobs.audience.Audience`)."""
        self.audience.watch(key, session)

    def open_files(self, result_json: str | bytes | dict, curves_json: str | bytes | dict | None = None,
                   owner: str | None = None) -> Job:
        """A finished analysis job from saved files (:func:`swapkl.jobs.opened.opened_job`: a ``score --json``
        result, optionally its ``curves --json``), so the pages can browse it without the model or the cache.
        ``owner``: the browser session that opened it; only that session sees the job (:meth:`jobs` with
        ``viewer``), never another visitor's "last analysis"; it keeps ``policy.max_opened`` (:class:`OpenedLRU`)."""
        job = opened_job(result_json, curves_json, owner, policy=self.policy)
        with self._lock:
            old = self._jobs.get(job.key)
            if old is not None:
                return self.opened.use(old, self._jobs, self._order)
            self._remember(job)
            return self.opened.use(job, self._jobs, self._order)

    def get(self, key: str | None, viewer: str | None = None) -> Job | None:
        """The job ``key``; with ``viewer``, None for another session's private job (its own: a use of it)."""
        with self._lock:
            job = self._jobs.get(key) if key else None
            if job is not None and viewer is not None and job.owner not in (None, viewer):
                return None
            return self.opened.touch(job) if viewer is not None else job

    def find(self, request) -> Job | None:
        """The job of an identical request, if any (without submitting); None for a request the policy refuses."""
        try:
            self.policy.check_request(request)
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

    def cancel(self, key: str, reason: str = "cancelled before it started") -> bool:
        """Ask a job to stop (a queued job is cancelled at once, with ``reason``).  Returns whether the job was
        active."""
        job = self.get(key)
        if job is None or not job.running:
            return False
        job.request_cancel()
        with self._lock:
            if job.status == QUEUED and job in self._queue:
                self._queue.remove(job)
                renumber(self._queue, busy(self._jobs))
                job.finish(CANCELLED, reason)
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
        """A loaded checkpoint from the LRU (:class:`~swapkl.jobs.models.ModelCache`; loaded on a miss); do not mutate it."""
        return self.models.get(model, revision, dtype, device)

    def loaded_models(self) -> list[tuple]:
        return self.models.keys()

    def export_pruned(self, job: Job, removed, out_dir: str | Path, force: bool = False, merge=None, fmt: str = "hf",
                      provenance: dict | None = None, model_ref: str | None = None) -> Path:
        """Export the job's model minus layers ``removed`` to ``out_dir`` in format ``fmt`` (hf | mergekit | gguf:
        :func:`swapkl.surgery.exports.export_removal`, which says what ``merge``, ``provenance`` and ``model_ref``
        are); the shared model is not changed; an existing export needs ``force``.  Returns the folder or file."""
        from swapkl.surgery.exports import export_removal  # deferred: torch

        req = job.request
        ck = self.checkpoint_for(req.model, req.revision, req.contract.dtype, req.contract.device)
        with heavy.exclusive():  # saving resolves lazy transformers modules while a job may load a model
            rep = export_removal(ck.model, list(removed), out_dir, fmt, tokenizer=ck.tokenizer, identity=ck.identity,
                                 force=force, merge=merge, provenance=provenance, model_ref=model_ref)
        return Path(rep["path"])

    # ---------------------------------------------------------------- internals
    def _remember(self, job: Job) -> None:
        if job.key in self._jobs:
            self._order.remove(job.key)
        self._jobs[job.key] = job
        self._order.append(job.key)

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=work, args=(self,), name="swapkl-jobs", daemon=True)
            self._worker.start()
        if self.audience.alive is not None and (self._monitor is None or not self._monitor.is_alive()):
            self._monitor = threading.Thread(target=monitor, args=(self,), name="swapkl-audience", daemon=True)
            self._monitor.start()

    def _run(self, job: Job) -> None:
        if job.start():
            run_job(job, self.models, self.snapshots if self.use_snapshots else None, self.log_path)
