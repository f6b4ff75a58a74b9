"""A demo server's export as a job of the queue (:class:`ExportRequest`, run by the worker through
:func:`run_export`): admitted under the same per-session and server bounds as every computation
(:meth:`swapkl.jobs.JobManager.submit`), never in a page's thread.

The job enforces the exports folder's quota first (:func:`swapkl.jobs.export_quota.enforce_quota`: entries older
than ``max_age_s`` seconds, then the oldest, until the folder holds at most ``quota_bytes`` bytes; never the export
being written), then writes the export into a hidden temporary folder below ``<cache>/exports``, removes every
absolute server path from its text files (:func:`swapkl.jobs.scrub.scrub_folder`), builds the download of a folder
once -- ``<name>.zip``, written atomically (:func:`swapkl.store.atomic_path`) from the very files written -- and
renames the export to its name; then it enforces the quota again with the new export counted (the folder ends under
the quota unless the new export alone is over it).  An export already there under its name (the name holds the
hash of the whole request, :func:`swapkl.jobs.exports.export_name`) is reused, not written again.  The outcome is
``job.export`` (:func:`export_record`); the page offers exactly the bytes of ``job.export["download"]``."""
from __future__ import annotations

import os
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swapkl import heavy
from swapkl.errors import SwapklError

from .export_quota import enforce_quota, remove_entry, touch
from .job import DONE


@dataclass(frozen=True)
class ExportRequest:
    """One export of a demo server: the model (``model``, ``revision``, loaded as ``dtype`` on ``device``) minus
    ``removed`` (or merged by ``merge``) in format ``fmt`` under the server-derived ``name`` in the folder ``root``
    (``<cache>/exports``; never a browser's text).  ``provenance`` / ``model_ref``: for a mergekit YAML's header and
    model line.  ``heal``: ``{"method", "n", "anyway", "job"}`` for the healed model of a heal job (``job``: its key;
    the job itself is ``source``, not part of the request's key).  ``quota_bytes`` and ``max_age_s``: the folder's
    bounds (bytes, seconds), enforced before writing."""

    model: str
    revision: str | None
    removed: tuple
    name: str
    root: str
    fmt: str = "hf"
    dtype: str = "float32"
    device: str = "auto"
    merge: Any = None
    provenance: Any = None
    model_ref: str | None = None
    heal: Any = None
    quota_bytes: int = 2048 << 20
    max_age_s: float = 86400.0
    kind: str = "export"
    source: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "removed", tuple(int(i) for i in self.removed))
        if "/" in self.name or self.name.startswith(".") or not self.name:
            raise SwapklError(f"export name {self.name!r} is not allowed")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "revision": self.revision, "removed": list(self.removed),
                "name": self.name, "root": self.root, "fmt": self.fmt, "dtype": self.dtype, "device": self.device,
                "merge": self.merge, "provenance": self.provenance, "model_ref": self.model_ref, "heal": self.heal,
                "quota_bytes": self.quota_bytes, "max_age_s": self.max_age_s}

    def label(self) -> str:
        m = self.model + (f"@{self.revision}" if self.revision else "")
        what = f"healed, {self.heal['method']} n = {self.heal['n']}" if self.heal else f"minus {list(self.removed)}"
        return f"export: {m} {what} ({self.fmt})"


def paths(req: ExportRequest) -> tuple[Path, Path | None]:
    """``(export, download zip or None)`` of ``req``: ``<root>/<name>`` and, for a folder, ``<root>/<name>.zip``."""
    out = Path(req.root) / req.name
    return out, (out.with_name(out.name + ".zip") if req.fmt == "hf" else None)


def export_record(req: ExportRequest, reused: bool, quota) -> dict:
    """``job.export``: ``path`` and ``download`` (the file the page serves: the zip of a folder, else the file),
    ``file_name`` of the download, ``bytes`` (its size), ``files`` (the export's files, relative, sorted),
    ``removed``, ``fmt``, ``reused`` and what the quota removed (``quota``: names, bytes freed, bytes left)."""
    out, zp = paths(req)
    dl = zp or out
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) if out.is_dir() else [out.name]
    return {"path": str(out), "download": str(dl), "file_name": dl.name, "bytes": dl.stat().st_size, "files": files,
            "removed": list(req.removed), "fmt": req.fmt, "reused": reused,
            "quota": {"removed": quota.removed, "freed": quota.freed, "left": quota.left}}


def exists(req: ExportRequest) -> bool:
    """Whether the export of ``req`` is complete under its name (its zip too, for a folder)."""
    out, zp = paths(req)
    return out.exists() and (zp is None or zp.is_file())


def gone(job) -> bool:
    """Whether ``job`` is a finished export whose files the quota (or an operator) has removed since: the
    manager then runs it again instead of handing back the old job."""
    if getattr(job.request, "kind", None) != "export" or job.status != DONE:
        return False
    rec = getattr(job, "export", None) or {}
    return not (rec.get("download") and Path(rec["download"]).exists() and Path(rec["path"]).exists())


def run_export(job, models) -> None:
    """The worker's part: quota, then the export written (or reused), scrubbed and zipped, then the quota again
    with it counted; sets ``job.export``."""
    req: ExportRequest = job.request
    root = Path(req.root)
    root.mkdir(parents=True, exist_ok=True)
    job.phase(1, 2, "making room in the exports folder")
    quota = enforce_quota(root, req.quota_bytes, req.max_age_s, keep=req.name)
    if exists(req):
        touch([p for p in paths(req) if p is not None])
        job.export = export_record(req, True, quota)
        return
    job.phase(2, 2, f"writing {req.name}")
    from swapkl.jobs.scrub import public_name, scrub_folder, server_roots
    from swapkl.store import temp_folder

    ck = models.get(req.model, req.revision, req.dtype, req.device)
    out, zp = paths(req)
    with temp_folder(root, f".{req.name}.") as tmp:
        dest = tmp / req.name
        _write(req, ck, models, dest)
        scrub_folder(dest, public_name(ck.identity, req.model), server_roots())
        if zp is not None:
            write_zip(dest, zp)
        if out.exists():  # a folder left without its zip: replaced as a whole
            remove_entry(out)
        os.replace(dest, out)
        tmp.rmdir()
    after = enforce_quota(root, req.quota_bytes, req.max_age_s, keep=req.name)  # room for what was just written
    quota.removed += after.removed
    quota.freed += after.freed
    quota.left = after.left
    job.export = export_record(req, False, quota)


def _write(req: ExportRequest, ck, models, dest: Path) -> None:
    """Write the export of ``req`` to ``dest`` (a new path in a hidden temporary folder)."""
    if req.heal:
        from swapkl.jobs.heal_export import export_healed_model

        src = req.source
        if src is None or src.key != req.heal.get("job"):
            raise SwapklError("the heal job of this export is gone; compute it again")
        export_healed_model(types.SimpleNamespace(checkpoint_for=models.get), src, req.heal["method"],
                            int(req.heal["n"]), dest, anyway=bool(req.heal.get("anyway")))
        return
    from swapkl.surgery.exports import export_removal  # deferred: torch

    with heavy.exclusive():  # saving resolves lazy transformers modules while a job may load a model
        export_removal(ck.model, list(req.removed), dest, req.fmt, tokenizer=ck.tokenizer, identity=ck.identity,
                       merge=req.merge, provenance=req.provenance, model_ref=req.model_ref)


def write_zip(folder: Path, path: Path, max_bytes: int = 4 << 30) -> int:
    """:func:`swapkl.surgery.outputs.write_folder_zip` of ``folder`` written to ``path`` atomically; returns its size
    in bytes."""
    from swapkl.store import atomic_path
    from swapkl.surgery.outputs import write_folder_zip

    with atomic_path(path) as tmp:
        write_folder_zip(folder, tmp, max_bytes)
    return path.stat().st_size
