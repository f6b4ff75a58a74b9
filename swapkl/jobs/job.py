"""One background computation and its state: :class:`Job` (status, progress, partial results) and its
transitions -- :meth:`Job.start`, :meth:`Job.phase`, :meth:`Job.tick`, :meth:`Job.finish`, :meth:`Job.request_cancel`
-- which the worker calls; pages only read."""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from swapkl.store import atomic_write_text

QUEUED, RUNNING, DONE, ERROR, CANCELLED = "queued", "running", "done", "error", "cancelled"
FINISHED = (DONE, ERROR, CANCELLED)


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


#: size of every progress file, in bytes (the JSON is ~300-600 bytes, padded with spaces after it)
PROGRESS_FILE_BYTES = 4096


def progress_json(progress: dict) -> str:
    """``progress`` as JSON padded with trailing spaces to a multiple of :data:`PROGRESS_FILE_BYTES` (ASCII: one
    byte a character).  The static file server takes a file's length from one ``stat`` and streams the file it then
    opens; a version replaced in between with another length made it fail the response ("Too much / too little
    data for declared Content-Length", a traceback in the server log).  Versions of one size cannot disagree."""
    text = json.dumps(progress, ensure_ascii=True)
    return text + " " * (-len(text) % PROGRESS_FILE_BYTES)


class Job:
    """A computation and everything it has produced so far (read by the pages, written by the worker).

    ``status``: queued / running / done / error / cancelled.  ``result``: the (partial while running)
    :class:`~swapkl.scoring.results.SwapResult`; ``curves``: the (partial) ``CurvesResult``; ``trajectory``: a
    :class:`~swapkl.trajectory.compute.Trajectory` (trajectory jobs); ``error``: one line; ``from_snapshot``: served
    from a finished snapshot without computing."""

    def __init__(self, key: str, request):
        self.key = key
        self.request = request
        # per drawable part, how often it was replaced (a page redraws only when a part it shows changed)
        self.updates = {"result": 0, "curves": 0, "trajectory": 0, "evidence": 0, "tasks": 0, "heal": 0,
                        "comparison": 0, "bridged": 0, "study": 0, "export": 0}
        self.progress_path: Path | None = None  # where publish writes the progress JSON (the dashboard's poll)
        self._published = 0.0
        self.status = QUEUED
        self.result = None
        self.curves = None
        self.trajectory = None
        self.evidence = None  # an EvidenceResult (evidence jobs)
        self.tasks = None  # a TasksResult (task accuracy jobs)
        self.heal = None  # a HealCurves (healing jobs)
        self.comparison = None  # a CompareResult (compare jobs)
        self.study = None  # a StudyResult (study jobs; partial while it runs)
        self.export = None  # export jobs: what was written and what the page serves (swapkl.jobs.export_job)
        self.bridged = None  # a BridgedResult's dict (analysis jobs with a bridge repair): the third matrix
        self.error: str | None = None
        self.error_kind: str | None = None
        self.from_snapshot = False
        self.bundle: str | None = None  # the caption of a demo bundle this job was opened from
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
        self.client: str | None = None     # the client address that submitted it (per-address limits)
        self.time_limit: float | None = None  # wall seconds it may run (demo mode); past them it stops
        self.stop_reason: str | None = None   # why it stopped early, when it was not a visitor's cancel
        # an opened file whose model this server does not offer (demo mode): browsed, never loaded or exported
        self.browse_only = False
        self.queue_place: int | None = None  # while queued: computations ahead of it (the running one included)

    # ---------------------------------------------------------------- state
    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in self.__dict__.get("updates", ()) and "updates" in self.__dict__:
            self.updates[name] += 1
            if getattr(self, "progress_path", None) is not None:
                self.publish(force=True)

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
            k = self.queue_place
            if not k:
                return "queued (another computation runs first)"
            return (f"queued: {k} computation{'s' * (k != 1)} ahead of this one (they run one at a time); it "
                    "starts by itself, keep this page open")
        return (f"step {p.step}/{p.steps}: {p.phase} — {p.what} — {p.done}/{p.total} · elapsed {fmt_s(p.elapsed_s)} "
                f"· ETA (this step) {fmt_s(p.eta_s)}")

    def progress_dict(self) -> dict:
        """What a polling page needs, JSON-able: status, ``updates`` (per drawable part -- result, curves,
        trajectory -- how often it changed), ``step`` (the pipeline step: a page redraws when a step ends, e.g.
        when the adjacent pairs are complete), ``fraction`` (0..1) and ``text`` (:meth:`progress_line`)."""
        p = self.progress()
        return {"key": self.key, "status": self.status, "finished": not self.running, "updates": dict(self.updates),
                "step": p.step, "fraction": p.fraction, "text": self.progress_line()}

    def publish(self, force: bool = False, min_interval_s: float = 0.5) -> None:
        """Write :meth:`progress_dict` to ``progress_path`` (at most every ``min_interval_s`` unless ``force``):
        the dashboard's progress line polls this small file from the browser, so following a job costs the
        server nothing.  Readers see the old or the new file (:func:`swapkl.store.atomic_write_text`), and every
        version has the same size (:func:`progress_json`); errors are ignored."""
        path = self.progress_path
        now = time.monotonic()
        if path is None or (not force and now - self._published < min_interval_s):
            return
        self._published = now
        try:
            atomic_write_text(path, progress_json(self.progress_dict()))
        except OSError:
            pass

    # ---------------------------------------------------------------- transitions (the worker's side)
    def start(self) -> bool:
        """queued -> running; False (and the job ends as cancelled) when a cancel came first."""
        if self._cancel.is_set():
            self.finish(CANCELLED, "cancelled before it started")
            return False
        self.status = RUNNING
        self.started = time.time()
        return True

    def request_cancel(self) -> None:
        """Ask the job to stop (polled by the computation through :meth:`should_stop`)."""
        self._cancel.set()

    def done_from(self, note: str, result=None, curves=None, trajectory=None, evidence=None, tasks=None,
                  heal=None, comparison=None, bridged=None, study=None) -> None:
        """Finished at once without computing (a snapshot or an opened file), holding these parts."""
        for name, part in (("result", result), ("curves", curves), ("trajectory", trajectory), ("evidence", evidence),
                           ("tasks", tasks), ("heal", heal), ("comparison", comparison), ("bridged", bridged), ("study", study)):
            if part is not None:
                setattr(self, name, part)
        self.from_snapshot = True
        self.started = time.time()
        self.phase(1, 1, note)
        self.finish(DONE)

    def phase(self, step: int, steps: int, phase: str, total: int = 0) -> None:
        """Step ``step`` of ``steps`` begins (its progress counts from 0 of ``total``)."""
        with self._lock:
            self._progress = Progress(step=step, steps=steps, phase=phase, done=0, total=total, what="")
            self._phase_t0 = time.perf_counter()
            self._phase_done0 = 0
        self.note(f"step {step}/{steps}: {phase}")
        self.publish(force=True)

    def tick(self, done: int, total: int | None, what: str) -> None:
        """Progress inside the current step (the ``progress(done, total, what)`` callback of the library)."""
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
        self.publish()

    def should_stop(self) -> bool:
        """Whether a cancel was requested or the job ran past its :attr:`time_limit` (the library's
        ``should_stop`` callback; the library then stops with its finished parts kept)."""
        if (self.time_limit is not None and self.started is not None and not self._cancel.is_set()
                and time.time() - self.started > self.time_limit):
            self.stop_reason = (f"stopped after {fmt_s(self.time_limit)}, this server's time limit for one "
                                "computation; the finished parts are kept (cached), so asking again resumes there")
            self._cancel.set()
        return self._cancel.is_set()

    def finish(self, status: str, error: str | None = None, kind: str | None = None) -> None:
        """The job ends as ``status`` (done / error / cancelled) with ``error`` (one line) of ``kind``."""
        self.status = status
        self.error = error
        self.error_kind = kind
        self.finished = time.time()
        with self._lock:
            if status == DONE:
                self._progress.done = self._progress.total
                self._progress.eta_s = 0.0
        self.note(f"{status}" + (f": {error}" if error else ""))
        self.publish(force=True)
        self._done_evt.set()

    def summary(self) -> dict:
        """A JSON-able view of the job (for logs and tests)."""
        p = self.progress()
        return {"key": self.key, "status": self.status, "label": self.request.label(), "error": self.error,
                "progress": dataclasses.asdict(p), "from_snapshot": self.from_snapshot,
                "pairs": len(self.result.pairs) if self.result is not None else 0,
                "curves_methods": list(self.curves.methods) if self.curves is not None else []}
