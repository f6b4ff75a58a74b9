"""The dashboard backend (no Streamlit here): a page builds a request and submits it to the :class:`JobManager`,
which runs it as a :class:`Job` on its worker thread (identical requests share one job) and snapshots the result.

Its modules and what each holds: docs/architecture.md (the ``jobs/`` row of the package map); what a job computes,
step by step: :mod:`swapkl.jobs.pipelines`; the behaviour a visitor sees (progress, cancel, snapshots, errors):
docs/dashboard.md.  The names below are the package's public API.
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
