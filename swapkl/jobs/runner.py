"""Running one job on the worker thread: the pipeline, its snapshot, and how it ends (done, cancelled with its
partial results, or one readable error).  A failure that may be transient -- an import or load error that is
neither the user's (:class:`~swapkl.errors.SwapklError`) nor out-of-memory -- is retried once, after the heavy
imports are made again under their lock (:func:`swapkl.heavy.ensure`), before the user sees it."""
from __future__ import annotations

import logging
import traceback
from contextlib import nullcontext
from pathlib import Path

from swapkl import heavy
from swapkl.errors import ComputeInterrupted, SwapklError, is_oom

from . import pipelines
from .failures import readable_error
from .job import CANCELLED, DONE, ERROR, Job
from .models import ModelCache
from .requests import task_settings
from .snapshots import SnapshotStore

log = logging.getLogger("swapkl.jobs")

#: attempts of one job when the first fails with a possibly transient error
ATTEMPTS = 2


def transient(e: BaseException) -> bool:
    """Whether ``e`` may pass on a second try: an import or load failure that is not the user's (a bad spec,
    an unsupported model: :class:`SwapklError`) and not out-of-memory.  A first-import race in a lazy package
    (transformers) is the case this is for."""
    if isinstance(e, (SwapklError, ComputeInterrupted)) or is_oom(e):
        return False
    return isinstance(e, (ImportError, AttributeError, OSError, RuntimeError))


def _tasks_held(request):
    """The request's lm-eval tasks loaded once for the job, on this worker thread
    (:func:`swapkl.measure.lmeval.preloaded`): an unknown or unloadable task fails before the model is loaded, and
    the disjointness check and the measurement use the same task objects.  Nothing for a request without tasks."""
    settings = task_settings(request)
    if settings is None:
        return nullcontext()
    from swapkl.measure import lmeval

    return lmeval.preloaded(settings.include_path, settings.tasks)


def _pipeline(job: Job, models: ModelCache) -> None:
    heavy.ensure()  # waits for the warm-up's imports instead of racing them
    with _tasks_held(job.request):
        _dispatch(job, models)


def _dispatch(job: Job, models: ModelCache) -> None:
    if job.request.kind == "trajectory":
        pipelines.run_trajectory(job, models)
    elif job.request.kind == "evidence":
        pipelines.run_evidence(job, models)
    elif job.request.kind == "tasks":
        pipelines.run_tasks(job, models)
    elif job.request.kind == "heal":
        pipelines.run_heal(job, models)
    elif job.request.kind == "compare":
        pipelines.run_compare(job, models)
    elif job.request.kind == "export":
        from swapkl.jobs.export_job import run_export

        run_export(job, models)
    elif job.request.kind == "study":
        from swapkl.jobs.studies import run_study_job

        run_study_job(job, models)
    else:
        pipelines.run_analysis(job, models)


def run_job(job: Job, models: ModelCache, snapshots: SnapshotStore | None, log_path: Path | None) -> None:
    """Run ``job`` (already started) to its end; never raises.  ``snapshots``: where a finished job is saved
    (None: not saved)."""
    log.info("job %s started: %s", job.key, job.request.label())
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _pipeline(job, models)
            if snapshots is not None:
                snapshots.save(job)
            job.finish(DONE)
            return
        except ComputeInterrupted as e:
            partial = getattr(e, "partial", None)
            if partial is not None and job.request.kind == "analysis" and hasattr(partial, "methods"):
                job.curves = partial
            if partial is not None and job.request.kind == "tasks":
                job.tasks = partial
            job.finish(CANCELLED, job.stop_reason or "cancelled; finished pairs are kept in the cache")
            return
        except BaseException as e:  # every failure becomes one readable line, the app goes on
            phase = job.progress().phase
            if attempt < ATTEMPTS and transient(e) and not job.cancel_requested:
                log.warning("job %s failed while %s (%s: %s); retrying once:\n%s", job.key, phase,
                            type(e).__name__, e, traceback.format_exc())
                job.note(f"retrying after {type(e).__name__} while {phase}")
                continue
            msg, kind = readable_error(e, phase, log_path)
            if kind != "user":
                log.error("job %s (%s) failed while %s:\n%s", job.key, job.request.label(), phase,
                          traceback.format_exc())
            else:
                log.info("job %s: %s", job.key, msg)
            job.finish(ERROR, msg, kind)
            return
