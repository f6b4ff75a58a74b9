"""Finished jobs on disk: ``<root>/<job key>/`` holds ``request.json`` and ``result.json`` + ``curves.json``
(analysis) or ``trajectory.json``; a later identical request is served from it at once, without the model.
Every file is written atomically (write + rename); an unreadable snapshot is ignored (and recomputed)."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from swapkl.curves import CurvesResult
from swapkl.errors import SwapklError
from swapkl.results import SwapResult, atomic_write_text
from swapkl.trajectory import Trajectory

from .job import Job

log = logging.getLogger("swapkl.jobs")


class SnapshotStore:
    """Snapshots of finished jobs under ``root`` (by default ``<cache>/dashboard``)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def folder(self, job: Job) -> Path:
        return self.root / job.key

    def save(self, job: Job) -> None:
        """Write the job's results; a read-only cache only logs a warning (the job is still done)."""
        d = self.folder(job)
        try:
            d.mkdir(parents=True, exist_ok=True)
            if job.request.kind == "trajectory":
                atomic_write_text(d / "trajectory.json", json.dumps(job.trajectory.to_dict()))
            else:
                job.result.save(d / "result.json")
                if job.curves is not None:
                    atomic_write_text(d / "curves.json", job.curves.to_json())
            atomic_write_text(d / "request.json", json.dumps(job.request.to_dict() | {"finished": time.time()}))
        except OSError as e:
            log.warning("cannot write the snapshot of job %s: %s", job.key, e)

    def load(self, job: Job) -> bool:
        """Finish ``job`` from its snapshot; False when there is none or it cannot be read."""
        d = self.folder(job)
        if not (d / "request.json").is_file():
            return False
        parts: dict = {}
        try:
            if job.request.kind == "trajectory":
                traj = Trajectory.from_dict(json.loads((d / "trajectory.json").read_text()), f"snapshot {d}")
                parts = {"trajectory": traj, "result": traj.results[-1] if traj.results else None}
            else:
                parts["result"] = SwapResult.load(d / "result.json")
                if job.request.wants_curves:
                    if not (d / "curves.json").is_file():
                        return False
                    parts["curves"] = CurvesResult.from_json(d / "curves.json")
        except (OSError, ValueError, KeyError, TypeError, SwapklError) as e:
            log.warning("ignoring the unreadable snapshot %s: %s", d, e)
            return False
        job.done_from("loaded from the cache", **parts)
        return True
