"""Finished jobs on disk: ``<root>/<job key>/snapshot.json``, one checksummed store entry
(:mod:`swapkl.store`) holding the request and the job's results (``result`` + ``curves`` for an analysis,
``bridged`` too after a bridge repair, ``trajectory`` for a trajectory, ``result`` + ``tasks`` for task accuracy, ``heal`` for healed curves); a later identical request is served from it at once, without the model.
A damaged or old-format snapshot is ignored (and the job recomputed)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from swapkl.removal.curves import CurvesResult
from swapkl.errors import SwapklError
from swapkl.scoring.results import SwapResult
from swapkl.store import CorruptEntry, read_entry, write_entry
from swapkl.trajectory.compute import Trajectory
from .job import Job

log = logging.getLogger("swapkl.jobs")
KIND = "job-snapshot"


class SnapshotStore:
    """Snapshots of finished jobs under ``root`` (by default ``<cache>/dashboard``)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, job: Job) -> Path:
        return self.root / job.key / "snapshot.json"

    def save(self, job: Job) -> None:
        """Write the job's results; a read-only cache only logs a warning (the job is still done).  An export job
        has none (its export is the file it wrote)."""
        if job.request.kind == "export":
            return
        data = {"request": job.request.to_dict(), "finished": time.time()}
        if job.request.kind == "trajectory":
            data["trajectory"] = job.trajectory.to_dict()
        elif job.request.kind == "evidence":
            data["evidence"] = job.evidence.to_dict()
        elif job.request.kind == "tasks":
            data["result"] = job.result.to_dict() if job.result is not None else None
            data["tasks"] = job.tasks.to_dict()
        elif job.request.kind == "heal":
            data["heal"] = job.heal.to_dict()
        elif job.request.kind == "compare":
            data["comparison"] = job.comparison.to_dict()
        elif job.request.kind == "study":
            data["study"] = job.study.to_dict()
        else:
            data["result"] = job.result.to_dict()
            data["curves"] = job.curves.to_dict() if job.curves is not None else None
            data["bridged"] = job.bridged  # the third matrix of a repaired analysis (None without a repair)
        try:
            write_entry(self.path(job), KIND, data)
        except OSError as e:
            log.warning("cannot write the snapshot of job %s: %s", job.key, e)

    def read(self, job: Job) -> dict | None:
        """The stored request and results of ``job`` (None when there is none); raises CorruptEntry."""
        return read_entry(self.path(job), KIND)

    def load(self, job: Job) -> bool:
        """Finish ``job`` from its snapshot; False when there is none or it cannot be used (an export job: never)."""
        if job.request.kind == "export":
            return False
        where = self.path(job)
        try:
            data = self.read(job)
            if data is None:
                return False
            if job.request.kind == "trajectory":
                traj = Trajectory.from_dict(data["trajectory"], f"snapshot {where}")
                parts = {"trajectory": traj, "result": traj.results[-1] if traj.results else None}
            elif job.request.kind == "evidence":
                from swapkl.evidence.run import EvidenceResult

                if not isinstance(data.get("evidence"), dict) or "ground_truth" not in data["evidence"]:
                    return False
                if getattr(job.request, "repair", "none") != "none" and not data["evidence"].get("repair"):
                    return False  # a request with a repair is not answered by evidence without its part
                if getattr(job.request, "tasks", ()) and not data["evidence"].get("task_truth"):
                    return False  # nor a request with tasks by evidence without its task ground truth
                parts = {"evidence": EvidenceResult(data["evidence"])}
            elif job.request.kind == "tasks":
                from swapkl.removal.tasks import TasksResult

                parts = {"tasks": TasksResult.from_dict(data["tasks"]),
                         "result": SwapResult.from_dict(data["result"], f"snapshot {where}") if data.get("result")
                         else None}
            elif job.request.kind == "heal":
                from swapkl.healing.curves import HealCurves

                parts = {"heal": HealCurves.from_dict(data["heal"], f"snapshot {where}")}
            elif job.request.kind == "compare":
                from swapkl.compare.result import CompareResult

                parts = {"comparison": CompareResult.from_dict(data["comparison"], f"snapshot {where}")}
            elif job.request.kind == "study":
                from swapkl.study.result import StudyResult

                parts = {"study": StudyResult.from_dict(data["study"], f"snapshot {where}")}
            else:
                if job.request.wants_curves and data.get("curves") is None:
                    return False
                parts = {"result": SwapResult.from_dict(data["result"], f"snapshot {where}")}
                if getattr(job.request, "repair", "none") != "none":
                    if not isinstance(data.get("bridged"), dict):
                        return False  # a repaired analysis is not answered without its bridged matrix
                    from swapkl.schema.bridged import bridged_result

                    parts["bridged"] = bridged_result(data["bridged"])  # a damaged one: one line, recomputed
                if data.get("curves") is not None:
                    parts["curves"] = CurvesResult.from_dict(data["curves"], f"snapshot {where}")
        except (CorruptEntry, KeyError, TypeError, ValueError, SwapklError) as e:
            log.warning("ignoring the unusable snapshot %s: %s", where, e)
            return False
        job.done_from("loaded from the cache", **parts)
        return True
