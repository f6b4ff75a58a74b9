"""Background computations for the dashboard (no Streamlit here): a :class:`JobManager` owning a worker thread.

Modules: ``requests`` (what a page asks for, the job key), ``job`` (a job's state and transitions), ``pipelines``
(the analysis, curves and trajectory computations), ``models`` (the loaded-checkpoint LRU), ``snapshots`` (finished
jobs on disk), ``failures`` (one readable line per error), ``manager`` (the queue and the public API); what the
pages show, decided here: ``forms`` (requests from forms and shared links), ``contents`` (a job's verdict, content
keys for memoised figures), ``reports`` (the result JSON, the one-click report), ``exports`` (formats and names of
an export); docs/architecture.md names the rest.

A page never computes anything itself.  It builds a request -- :class:`AnalysisRequest` (model spec + revision,
:class:`~swapkl.contract.Contract`, removal budget, removal methods, perplexity evaluator) or
:class:`TrajectoryRequest` (a checkpoint list + contract) -- and calls :meth:`JobManager.submit`.  The request
is hashed into a key (together with a cheap content fingerprint of the model files, so an edited local
folder is a new request); identical requests share one :class:`Job`, so a browser refresh or a second tab sees
the same running job.

An analysis job runs, in order (each step reports ``progress(done, total, what)`` and an ETA):

1. load the checkpoint (an LRU of at most ``max_models`` loaded models; a shared model is never mutated --
   removal uses :func:`swapkl.surgery.prune.pruned_copy`, which shares tensors but not modules);
2. swap-KL on the **adjacent** pairs (:func:`swapkl.scoring.score.score`, both protocols), so the regime verdict is
   available early; ``on_partial`` publishes the partial :class:`~swapkl.scoring.results.SwapResult` after every pair;
3. swap-KL on the contract's wider pair set (``gap:K`` / ``all``), reusing the adjacent pairs from the cache;
4. removal curves (:func:`swapkl.removal.curves.removal_curves`) one method after the other with one shared
   :class:`~swapkl.removal.memo.EvalMemo`, publishing a partial ``CurvesResult`` after each method (guided ones first).

Finished jobs are snapshotted under ``<cache>/dashboard/<key>/`` (``result.json``, ``curves.json`` or
``trajectory.json``); a later identical request is served from the snapshot at once, without loading the
model.  Cancel sets a flag polled through ``should_stop``: the job ends as ``cancelled``, finished pairs stay in
the score cache and the partial results stay on the job.  Errors end the job as ``error`` with one readable
line: a :class:`~swapkl.errors.SwapklError` message as is, out-of-memory with advice, anything else with its
type and a pointer to the log file (``<cache>/logs/dashboard.log``, full traceback).
"""
from __future__ import annotations

from .failures import readable_error
from .job import CANCELLED, DONE, ERROR, FINISHED, QUEUED, RUNNING, Job, Progress, fmt_s
from .manager import JobManager
from .models import ModelCache
from .requests import (AnalysisRequest, EvidenceRequest, HealRequest, TasksRequest, TrajectoryRequest, quick_fingerprint,
                       request_key)
from .snapshots import SnapshotStore

__all__ = ["CANCELLED", "DONE", "ERROR", "FINISHED", "QUEUED", "RUNNING", "AnalysisRequest", "EvidenceRequest", "HealRequest", "Job",
           "JobManager", "ModelCache", "Progress", "SnapshotStore", "TasksRequest", "TrajectoryRequest", "fmt_s",
           "quick_fingerprint",
           "readable_error", "request_key"]
