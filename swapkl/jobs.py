"""Background computations for the dashboard (no Streamlit here): a :class:`JobManager` owning a worker thread.

A page never computes anything itself.  It builds a request -- :class:`AnalysisRequest` (model spec + revision,
:class:`~swapkl.contract.Contract`, removal budget, removal methods, perplexity evaluator) or
:class:`TrajectoryRequest` (a checkpoint list + contract) -- and calls :meth:`JobManager.submit`.  The request
is hashed into a key (together with a cheap content fingerprint of the model files, so an edited local
folder is a new request); identical requests share one :class:`Job`, so a browser refresh or a second tab sees
the same running job.

An analysis job runs, in order (each step reports ``progress(done, total, what)`` and an ETA):

1. load the checkpoint (an LRU of at most ``max_models`` loaded models; a shared model is never mutated --
   removal uses :func:`swapkl.prune.pruned_copy`, which shares tensors but not modules);
2. swap-KL on the **adjacent** pairs (:func:`swapkl.api.score`, both protocols), so the regime verdict is
   available early; ``on_partial`` publishes the partial :class:`~swapkl.results.SwapResult` after every pair;
3. swap-KL on the contract's wider pair set (``gap:K`` / ``all``), reusing the adjacent pairs from the cache;
4. removal curves (:func:`swapkl.curves.removal_curves`) one method after the other with one shared
   :class:`~swapkl.memo.EvalMemo`, publishing a partial ``CurvesResult`` after each method (guided ones first).

Finished jobs are snapshotted under ``<cache>/dashboard/<key>/`` (``result.json``, ``curves.json`` or
``trajectory.json``); a later identical request is served from the snapshot at once, without loading the
model.  Cancel sets a flag polled through ``should_stop``: the job ends as ``cancelled``, finished pairs stay in
the score cache and the partial results stay on the job.  Errors end the job as ``error`` with one readable
line: a :class:`~swapkl.errors.SwapklError` message as is, out-of-memory with advice, anything else with its
type and a pointer to the log file (``<cache>/logs/dashboard.log``, full traceback).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from swapkl import __version__
from swapkl import methods as M
from swapkl.contract import Contract, stable_hash
from swapkl.errors import ComputeInterrupted, SwapklError

log = logging.getLogger("swapkl.jobs")

QUEUED, RUNNING, DONE, ERROR, CANCELLED = "queued", "running", "done", "error", "cancelled"
FINISHED = (DONE, ERROR, CANCELLED)


# ============================================================================================ requests
def _evaluator_dict(ev) -> dict | None:
    """An evaluator given as a name (``"matched"``), an :class:`~swapkl.evaluate.Evaluator` or its dict -> dict."""
    if ev is None:
        return None
    if isinstance(ev, dict):
        return dict(ev)
    if isinstance(ev, str):
        from swapkl.evaluate import get_evaluator

        return get_evaluator(ev).to_dict()
    return ev.to_dict()


@dataclass(frozen=True)
class AnalysisRequest:
    """One dashboard analysis: both protocols under ``contract``, then removal curves up to ``budget``.

    ``budget = 0`` or no ``methods`` skips the curves.  ``evaluator``: ``"matched"`` / ``"standard"``, an
    :class:`~swapkl.evaluate.Evaluator`, or its dict (stored as the dict)."""

    model: str = "default"
    revision: str | None = None
    contract: Contract = field(default_factory=Contract)
    budget: int = 0
    methods: tuple = field(default_factory=lambda: M.default_set("dashboard"))
    evaluator: Any = None
    kind: str = "analysis"

    def __post_init__(self):
        object.__setattr__(self, "model", str(self.model).strip())
        object.__setattr__(self, "revision", (str(self.revision).strip() or None) if self.revision else None)
        object.__setattr__(self, "methods", tuple(m for m in self.methods if m))
        object.__setattr__(self, "evaluator", _evaluator_dict(self.evaluator))
        object.__setattr__(self, "budget", int(self.budget or 0))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "revision": self.revision,
                "contract": self.contract.to_dict(), "budget": self.budget, "methods": list(self.methods),
                "evaluator": self.evaluator}

    @property
    def wants_curves(self) -> bool:
        return self.budget > 0 and bool(self.methods)

    def label(self) -> str:
        m = self.model + (f"@{self.revision}" if self.revision else "")
        c = self.contract
        s = f"{m} · pairs {c.pairs} · {c.prompts}×{c.tokens}"
        return s + (f" · budget {self.budget}" if self.wants_curves else "")


@dataclass(frozen=True)
class TrajectoryRequest:
    """Both protocols on every checkpoint of ``checkpoints`` (a list text for
    :func:`swapkl.trajectory.parse_checkpoints`) under ``contract``.  ``train_demo=True``: ``checkpoints`` is
    a folder that :func:`swapkl.demo_trajectory.train_demo_trajectory` first fills (reused when already
    trained with the default settings)."""

    checkpoints: str
    contract: Contract = field(default_factory=Contract)
    train_demo: bool = False
    kind: str = "trajectory"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "checkpoints": self.checkpoints.strip(), "contract": self.contract.to_dict(),
                "train_demo": self.train_demo}

    def label(self) -> str:
        what = "demo trajectory" if self.train_demo else f"trajectory of {self.checkpoints.strip()[:60]}"
        return f"{what} · pairs {self.contract.pairs}"


def quick_fingerprint(model: str, revision: str | None = None) -> str:
    """A content fingerprint of a checkpoint spec without loading the model (sha256s are memoised on disk):
    built-in / GGUF: the GGUF file's sha256; local folder: its config + weight files; hub: ``id@revision``.
    Raises :class:`~swapkl.errors.ModelLoadError` for a missing path."""
    from swapkl.cache import file_sha256, folder_fingerprint
    from swapkl.checkpoints import parse_spec

    sp = parse_spec(model, revision)
    if sp.kind == "builtin":
        from swapkl import builtin

        return "builtin:" + file_sha256(builtin.default_gguf_path())
    if sp.kind == "gguf":
        return "gguf:" + file_sha256(sp.source)
    if sp.kind == "local":
        return "local:" + folder_fingerprint(sp.source)
    return f"hub:{sp.source}@{sp.revision or 'main'}"


def request_key(request) -> str:
    """The job key: hash of the request, the model fingerprint(s) and the swapkl version."""
    d = request.to_dict()
    if request.kind == "analysis":
        d["fingerprint"] = quick_fingerprint(request.model, request.revision)
    elif getattr(request, "train_demo", False):
        d["fingerprint"] = "demo"  # what the folder will hold is fixed by the demo's settings
    else:
        from swapkl.trajectory import parse_checkpoints

        d["fingerprint"] = [quick_fingerprint(s.spec, s.revision) for s in parse_checkpoints(request.checkpoints)]
    return stable_hash({"request": d, "version": __version__})[:20]


# ============================================================================================ jobs
def fmt_s(s: float | None) -> str:
    """Seconds as "42 s" / "3 min 05 s"; "…" when unknown."""
    if s is None:
        return "…"
    s = int(round(s))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


@dataclass
class Progress:
    """``done`` of ``total`` units (variants while scoring, evaluations during curves) in step ``step`` of
    ``steps``; ``what``: the item being computed; ``eta_s``: seconds left in this step (None = unknown)."""

    step: int = 0
    steps: int = 1
    phase: str = "queued"
    done: int = 0
    total: int = 0
    what: str = ""
    eta_s: float | None = None
    elapsed_s: float = 0.0

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


class Job:
    """A computation and everything it has produced so far (read by the pages, written by the worker).

    ``status``: queued / running / done / error / cancelled.  ``result``: the (partial while running)
    :class:`~swapkl.results.SwapResult`; ``curves``: the (partial) ``CurvesResult``; ``trajectory``: a
    :class:`~swapkl.trajectory.Trajectory` (trajectory jobs); ``error``: one line; ``from_snapshot``: served
    from a finished snapshot without computing."""

    def __init__(self, key: str, request):
        self.key = key
        self.request = request
        # per drawable part, how often it was replaced (a page redraws only when a part it shows changed)
        self.updates = {"result": 0, "curves": 0, "trajectory": 0}
        self.progress_path: Path | None = None  # where _publish writes the progress JSON (the dashboard's poll)
        self._published = 0.0
        self.status = QUEUED
        self.result = None
        self.curves = None
        self.trajectory = None
        self.error: str | None = None
        self.error_kind: str | None = None
        self.from_snapshot = False
        self.created = time.time()
        self.started: float | None = None
        self.finished: float | None = None
        self.log: collections.deque = collections.deque(maxlen=200)
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._done_evt = threading.Event()
        self._progress = Progress()
        self._phase_t0 = time.perf_counter()
        self._phase_done0 = 0
        self.checkpoint = None  # the loaded Checkpoint (analysis jobs), for exports
        self.owner: str | None = None      # set for a private job (an opened file): only that session sees it
        self.submitter: str | None = None  # the session that submitted a computation (per-session limits)

    # ---------------------------------------------------------------- state
    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in ("result", "curves", "trajectory") and "updates" in self.__dict__:
            self.updates[name] += 1
            if getattr(self, "progress_path", None) is not None:
                self._publish(force=True)

    @property
    def running(self) -> bool:
        return self.status in (QUEUED, RUNNING)

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def progress(self) -> Progress:
        with self._lock:
            p = dataclasses.replace(self._progress)
        if self.started is not None:
            p.elapsed_s = (self.finished or time.time()) - self.started
        return p

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the job finishes (True) or ``timeout`` seconds pass (False)."""
        return self._done_evt.wait(timeout)

    def note(self, msg: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {msg}")

    def progress_line(self) -> str:
        """The one-line status a page shows while the job runs: step, phase, item, counts, elapsed, ETA."""
        p = self.progress()
        if self.status == QUEUED:
            return "queued (another computation runs first)"
        return (f"step {p.step}/{p.steps}: {p.phase} — {p.what} — {p.done}/{p.total} · elapsed {fmt_s(p.elapsed_s)} "
                f"· ETA (this step) {fmt_s(p.eta_s)}")

    def progress_dict(self) -> dict:
        """What a polling page needs, JSON-able: status, ``updates`` (per drawable part -- result, curves,
        trajectory -- how often it changed), ``step`` (the pipeline step: a page redraws when a step ends, e.g.
        when the adjacent pairs are complete), ``fraction`` (0..1) and ``text`` (:meth:`progress_line`)."""
        p = self.progress()
        return {"key": self.key, "status": self.status, "finished": not self.running, "updates": dict(self.updates),
                "step": p.step, "fraction": p.fraction, "text": self.progress_line()}

    def _publish(self, force: bool = False, min_interval_s: float = 0.5) -> None:
        """Write :meth:`progress_dict` to ``progress_path`` (at most every ``min_interval_s`` unless ``force``):
        the dashboard's progress line polls this small file from the browser, so following a job costs the
        server nothing.  Readers see the old or the new file (write + rename); errors are ignored."""
        path = self.progress_path
        now = time.monotonic()
        if path is None or (not force and now - self._published < min_interval_s):
            return
        self._published = now
        try:
            tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(self.progress_dict()), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass

    # ---------------------------------------------------------------- worker side
    def _phase(self, step: int, steps: int, phase: str, total: int = 0) -> None:
        with self._lock:
            self._progress = Progress(step=step, steps=steps, phase=phase, done=0, total=total, what="")
            self._phase_t0 = time.perf_counter()
            self._phase_done0 = 0
        self.note(f"step {step}/{steps}: {phase}")
        self._publish(force=True)

    def _tick(self, done: int, total: int | None, what: str) -> None:
        with self._lock:
            p = self._progress
            if p.done == 0 and p.total == 0 or done < self._phase_done0:
                self._phase_done0 = done  # work already cached when the step started does not count for the rate
                self._phase_t0 = time.perf_counter()
            p.done = int(done)
            if total is not None:
                p.total = int(total)
            p.total = max(p.total, p.done)
            p.what = str(what)
            dt = time.perf_counter() - self._phase_t0
            worked = p.done - self._phase_done0
            p.eta_s = (dt / worked * (p.total - p.done)) if worked > 0 and dt > 0 else None
        self._publish()

    def _should_stop(self) -> bool:
        return self._cancel.is_set()

    def _finish(self, status: str, error: str | None = None, kind: str | None = None) -> None:
        self.status = status
        self.error = error
        self.error_kind = kind
        self.finished = time.time()
        with self._lock:
            if status == DONE:
                self._progress.done = self._progress.total
                self._progress.eta_s = 0.0
        self.note(f"{status}" + (f": {error}" if error else ""))
        self._publish(force=True)
        self._done_evt.set()

    def summary(self) -> dict:
        """A JSON-able view of the job (for logs and tests)."""
        p = self.progress()
        return {"key": self.key, "status": self.status, "label": self.request.label(), "error": self.error,
                "progress": dataclasses.asdict(p), "from_snapshot": self.from_snapshot,
                "pairs": len(self.result.pairs) if self.result is not None else 0,
                "curves_methods": list(self.curves.methods) if self.curves is not None else []}


# ============================================================================================ manager
def _oom_types() -> tuple:
    out: list = [MemoryError]
    try:
        import torch

        out.append(torch.OutOfMemoryError)
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    return tuple(out)


def readable_error(e: BaseException, phase: str, log_path: Path | None) -> tuple[str, str]:
    """``(one line for the user, kind)`` for an exception raised while ``phase`` ran; kind in
    {user, oom, bug}."""
    if isinstance(e, SwapklError):
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, "user"
    if isinstance(e, _oom_types()) or "out of memory" in str(e).lower():
        return (f"out of memory while {phase}: use fewer prompts or tokens, a smaller pair set or budget, "
                f"bfloat16, or a smaller model", "oom")
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    where = f"; traceback in {log_path}" if log_path else ""
    return f"unexpected error while {phase}: {type(e).__name__}: {first}{where}", "bug"


class JobManager:
    """Runs jobs one at a time on a daemon worker thread (two jobs on one CPU only slow each other down).

    ``max_models``: loaded checkpoints kept (LRU); ``root``: snapshot folder (default
    ``<cache>/dashboard``); ``log_path``: where tracebacks go (default ``<cache>/logs/dashboard.log``);
    ``loader``: ``load_checkpoint``-compatible callable (tests); ``progress_dir``: a folder the browser can read
    (the dashboard's static folder) where every job keeps ``<key>.json`` = :meth:`Job.progress_dict` current."""

    def __init__(self, max_models: int = 2, root: str | Path | None = None, log_path: str | Path | None = None,
                 loader: Callable | None = None, use_snapshots: bool = True, progress_dir: str | Path | None = None):
        from swapkl.cache import cache_root

        self.root = Path(root) if root is not None else cache_root() / "dashboard"
        self.log_path = Path(log_path) if log_path is not None else cache_root() / "logs" / "dashboard.log"
        self.max_models = max(1, int(max_models))
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
        self._loader = loader
        self._jobs: dict[str, Job] = {}
        self._order: list[str] = []
        self._lock = threading.RLock()
        self._queue: collections.deque = collections.deque()
        self._wake = threading.Condition(self._lock)
        self._models: collections.OrderedDict = collections.OrderedDict()
        self._models_lock = threading.Lock()
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
            job._finish(ERROR, *readable_error(e, "reading the model spec", None))
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
                    from swapkl.policy import PolicyError

                    raise PolicyError(f"you already have {len(mine)} computation{'s' * (len(mine) != 1)} queued "
                                      f"or running (at most {max_active} on this server): wait for "
                                      f"{'it' if len(mine) == 1 else 'one'} to finish or cancel it")
            job = Job(key, request)
            job.submitter = owner
            if self.progress_dir is not None:
                job.progress_path = self.progress_dir / f"{key}.json"
            self._remember(job)
            if self.use_snapshots and self._load_snapshot(job):
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
        from swapkl.curves import CurvesResult, check_same_model
        from swapkl.results import SwapResult

        def as_dict(x, what):  # size, depth and NaN limits; from_json checks every field (swapkl.schema)
            from swapkl.schema import parse_json

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
            job.result, job.curves, job.from_snapshot = result, curves, True
            job.started = time.time()
            job._finish(DONE)
            job.note("opened from file")
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
        job._cancel.set()
        with self._lock:
            if job.status == QUEUED and job in self._queue:
                self._queue.remove(job)
                job._finish(CANCELLED, "cancelled before it started")
        return True

    def shutdown(self, timeout: float = 5.0) -> None:
        """Cancel everything and stop the worker (tests)."""
        with self._lock:
            self._closed = True
            for j in self._jobs.values():
                if j.running:
                    j._cancel.set()
            self._wake.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    def checkpoint_for(self, model: str, revision: str | None, dtype: str = "float32", device: str = "auto"):
        """A loaded checkpoint from the LRU (loaded on a miss).  Callers must not mutate it."""
        key = (model, revision, dtype, device)
        with self._models_lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
        loader = self._loader
        if loader is None:
            from swapkl.checkpoints import load_checkpoint as loader
        ck = loader(model, revision=revision, dtype=dtype, device=device)
        with self._models_lock:
            self._models[key] = ck
            self._models.move_to_end(key)
            while len(self._models) > self.max_models:
                self._models.popitem(last=False)
        return ck

    def loaded_models(self) -> list[tuple]:
        with self._models_lock:
            return list(self._models)

    def export_pruned(self, job: Job, removed, out_dir: str | Path, force: bool = False, merge=None) -> Path:
        """Save the job's model with layers ``removed`` deleted to ``out_dir`` (:func:`swapkl.prune.save_pruned`;
        the shared model is not changed; an existing non-empty folder needs ``force``).  ``merge``: a LaCo-style
        merged model instead (``{"groups": [[3, 4], ...], "mode": "average" | "laco"}``).  Returns the folder."""
        from swapkl.prune import save_pruned

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
        if job._cancel.is_set():
            job._finish(CANCELLED, "cancelled before it started")
            return
        job.status = RUNNING
        job.started = time.time()
        phase = "starting"
        try:
            if job.request.kind == "trajectory":
                self._run_trajectory(job)
            else:
                self._run_analysis(job)
            if self.use_snapshots:
                self._save_snapshot(job)
            job._finish(DONE)
        except ComputeInterrupted as e:
            partial = getattr(e, "partial", None)
            if partial is not None and job.request.kind == "analysis" and hasattr(partial, "methods"):
                job.curves = partial
            job._finish(CANCELLED, "cancelled; finished pairs are kept in the cache")
        except BaseException as e:  # every failure becomes one readable line, the app goes on
            phase = job.progress().phase
            msg, kind = readable_error(e, phase, self.log_path)
            if kind != "user":
                log.error("job %s (%s) failed while %s:\n%s", job.key, job.request.label(), phase,
                          traceback.format_exc())
            else:
                log.info("job %s: %s", job.key, msg)
            job._finish(ERROR, msg, kind)

    # ---------------------------------------------------------------- analysis
    def _run_analysis(self, job: Job) -> None:
        from swapkl.api import score
        from swapkl.contract import pair_list

        req: AnalysisRequest = job.request
        c = req.contract
        wider = c.pairs != "adjacent"
        steps = 2 + int(wider) + int(req.wants_curves)
        job._phase(1, steps, f"loading {req.model}" + (f"@{req.revision}" if req.revision else ""))
        ck = self.checkpoint_for(req.model, req.revision, c.dtype, c.device)
        job.checkpoint = ck
        L = ck.num_layers
        job.note(f"loaded {ck.identity.get('display') or req.model}: {L} layers on {ck.device}")
        if req.wants_curves:  # an evaluator window beyond the model's context fails now, not after the scores
            from swapkl.curves import check_evaluator_context

            check_evaluator_context(ck.model, self._evaluator(req), name=ck.identity.get("display"))

        def publish(res):
            job.result = res

        job._phase(2, steps, "swap-KL on the adjacent pairs (both protocols)")
        adjacent = pair_list("adjacent", L)
        adj = score(ck, c, progress=job._tick, should_stop=job._should_stop, on_partial=publish,
                    pairs=adjacent, engine_kw=self._engine_kw(ck, c, len(adjacent)))
        job.result = adj
        full = adj
        if wider:
            job._phase(3, steps, f"swap-KL on the pair set {c.pairs} (adjacent pairs reused)")
            full = score(ck, c, progress=job._tick, should_stop=job._should_stop, on_partial=publish,
                         engine_kw=self._engine_kw(ck, c, len(c.pair_list(L))))
            job.result = full
        if req.wants_curves:
            job._phase(steps, steps, f"removal curves up to n = {req.budget}")
            self._run_curves(job, ck, full)

    @staticmethod
    def _engine_kw(ck, contract: Contract, n_pairs: int, chunks: int = 8) -> dict:
        """Engine limits that split a sweep into about ``chunks`` chunks of pairs (never more variants alive
        than the memory-based limit allows), so progress, partial results and cancel come several times per
        step instead of once at its end."""
        from swapkl.api import engine_limits

        lim = engine_limits(ck, contract.prompts, contract.tokens)
        per_chunk = max(2, -(-n_pairs // chunks))
        return {"max_live": max(3, min(lim["max_live"], 3 * per_chunk))}

    @staticmethod
    def _evaluator(req: AnalysisRequest):
        from swapkl.evaluate import Evaluator, get_evaluator

        return Evaluator.from_dict(req.evaluator) if req.evaluator else get_evaluator("matched")

    def _run_curves(self, job: Job, ck, res) -> None:
        from swapkl.corpora import load_corpus
        from swapkl.curves import disk_memo, removal_curves

        req: AnalysisRequest = job.request
        ev = self._evaluator(req)
        corpus = load_corpus(req.contract.corpus)
        scores = {"replacement": res.replacement(), "interchange": res.interchange()}
        memo = disk_memo(ck.identity, kl=True)  # evaluations survive a cancel or a restart
        plan = M.EvalPlan(budget=req.budget, num_layers=ck.num_layers, scores=scores)
        total = [M.expected_evaluations(req.methods, plan)]

        def prog(_done, _total, what):
            done = memo.misses + memo.disk_hits
            total[0] = max(total[0], done + 1)
            job._tick(done, total[0], what)

        job._tick(0, total[0], "baseline perplexity")
        # guided methods first; one call per added method so each finished curve shows at once (the memo makes
        # the repeated methods free)
        order = M.run_order(req.methods)
        for k in range(len(order)):
            curves = removal_curves(ck.model, ck.tokenizer, scores, req.budget, methods=order[: k + 1],
                                    evaluator=ev, corpus=corpus, progress=prog, should_stop=job._should_stop,
                                    memo=memo, identity=ck.identity)
            job.curves = curves
        job._tick(memo.misses + memo.disk_hits, memo.misses + memo.disk_hits, "removal curves finished")

    # ---------------------------------------------------------------- trajectory
    def _run_trajectory(self, job: Job) -> None:
        from swapkl.trajectory import Trajectory, compute_trajectory, parse_checkpoints

        req: TrajectoryRequest = job.request
        steps = 2 if req.train_demo else 1
        if req.train_demo:
            from swapkl import demo_trajectory

            job._phase(1, 2, "training the demo model (GPT-NeoX, CPU, about 3 min)")
            demo_trajectory.train_demo_trajectory(req.checkpoints, progress=job._tick, should_stop=job._should_stop)
        specs = parse_checkpoints(req.checkpoints)
        n = len(specs)
        job._phase(steps, steps, f"trajectory: {n} checkpoints, pairs {req.contract.pairs}")
        results: list = []
        cur = {"k": 0}

        def on_checkpoint(k, spec, res):
            results.append(res)
            cur["k"] = k + 1
            job.trajectory = Trajectory(specs=specs, results=list(results), contract=req.contract.to_dict())
            job.result = res

        def prog(done, total, what):
            # progress over the whole list: finished checkpoints + the current one's fraction
            frac = done / total if total else 0.0
            job._tick(int(1000 * (cur["k"] + frac)), 1000 * n, what)

        try:
            traj = compute_trajectory(specs, req.contract, progress=prog, should_stop=job._should_stop,
                                      on_checkpoint=on_checkpoint)
        except ComputeInterrupted:
            raise
        job.trajectory = traj

    # ---------------------------------------------------------------- snapshots
    def _snap_dir(self, job: Job) -> Path:
        return self.root / job.key

    def _save_snapshot(self, job: Job) -> None:
        from swapkl.results import atomic_write_text

        d = self._snap_dir(job)
        try:
            d.mkdir(parents=True, exist_ok=True)
            if job.request.kind == "trajectory":
                atomic_write_text(d / "trajectory.json", json.dumps(job.trajectory.to_json()))
            else:
                job.result.save(d / "result.json")
                if job.curves is not None:
                    atomic_write_text(d / "curves.json", job.curves.to_json())
            atomic_write_text(d / "request.json", json.dumps(job.request.to_dict() | {"finished": time.time()}))
        except OSError as e:  # a read-only cache: the job is still done
            log.warning("cannot write the snapshot of job %s: %s", job.key, e)

    def _load_snapshot(self, job: Job) -> bool:
        d = self._snap_dir(job)
        if not (d / "request.json").is_file():
            return False
        try:
            if job.request.kind == "trajectory":
                from swapkl.results import SwapResult
                from swapkl.trajectory import CheckpointSpec, Trajectory

                t = json.loads((d / "trajectory.json").read_text())
                specs = [CheckpointSpec(c["spec"], c.get("revision"), c.get("step"), c.get("label") or "")
                         for c in t["checkpoints"]]
                results = [SwapResult.from_json(r) for r in t["results"]]
                job.trajectory = Trajectory(specs=specs, results=results, contract=t.get("contract", {}))
                job.result = results[-1] if results else None
            else:
                from swapkl.curves import CurvesResult
                from swapkl.results import SwapResult

                job.result = SwapResult.load(d / "result.json")
                if job.request.wants_curves:
                    if not (d / "curves.json").is_file():
                        return False
                    job.curves = CurvesResult.from_json(d / "curves.json")
        except (OSError, ValueError, KeyError, TypeError, SwapklError) as e:
            log.warning("ignoring the unreadable snapshot %s: %s", d, e)
            job.result = job.curves = job.trajectory = None
            return False
        job.from_snapshot = True
        job.started = time.time()
        job._phase(1, 1, "loaded from the cache")
        job._finish(DONE)
        return True
