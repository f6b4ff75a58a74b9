"""The quota of a demo server's ``<cache>/exports`` folder, applied before each new export is written
(:func:`enforce_quota`): exports older than the policy's ``export_max_age_h`` are removed, then the oldest until the
folder's total size is under ``export_quota_mb``.  The export being written is never removed.

An *export* here is one name and everything that goes with it: ``<name>`` (a folder or a file) and ``<name>.zip``
(the download built from a folder).  Its size is the bytes of its regular files (symlinks not followed); its age is
measured from the newest modification time among its entries (seconds).  Entries whose name starts with ``.`` are
another writer's temporary folders or files (:func:`swapkl.store.temp_folder`, :func:`swapkl.store.atomic_path`):
they are left alone unless they are older than the age limit (a crashed writer's leftovers).  A removal first
renames the entry to a hidden name in the same folder (one atomic step: nobody sees half a folder under an export's
name), then deletes it.  Pure file-system code, no Streamlit, no policy object: the caller passes the numbers."""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

ZIP = ".zip"


@dataclass
class Export:
    """One export in the folder: its ``name`` (the zip's suffix removed), its ``paths``, ``size`` (bytes) and
    ``mtime`` (seconds since the epoch, the newest of its entries)."""

    name: str
    paths: list = field(default_factory=list)
    size: int = 0
    mtime: float = 0.0


@dataclass
class QuotaReport:
    """What :func:`enforce_quota` did: ``removed`` (names, oldest first), ``freed`` and ``left`` (bytes in the
    folder after it, the kept export included)."""

    removed: list = field(default_factory=list)
    freed: int = 0
    left: int = 0


def entry_size(path: Path) -> int:
    """Bytes of the regular files at or below ``path`` (symlinks counted as nothing, never followed); 0 when it is
    gone meanwhile."""
    try:
        if path.is_symlink():
            return 0
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


def export_name_of(entry: Path) -> str:
    """The export an entry belongs to: ``name.zip`` belongs to ``name``, anything else to itself."""
    return entry.name[: -len(ZIP)] if entry.name.endswith(ZIP) else entry.name


def scan(root: str | os.PathLike) -> tuple[list[Export], list[Path]]:
    """``(exports, hidden)`` of the folder ``root``: its exports, oldest first, and its hidden entries (names
    starting with ``.``: another writer's temporary files)."""
    root = Path(root)
    if not root.is_dir():
        return [], []
    groups: dict[str, Export] = {}
    hidden = []
    for entry in root.iterdir():
        if entry.name.startswith("."):
            hidden.append(entry)
            continue
        try:
            mtime = entry.lstat().st_mtime
        except OSError:  # removed meanwhile
            continue
        ex = groups.setdefault(export_name_of(entry), Export(export_name_of(entry)))
        ex.paths.append(entry)
        ex.size += entry_size(entry)
        ex.mtime = max(ex.mtime, mtime)
    return sorted(groups.values(), key=lambda e: (e.mtime, e.name)), hidden


def remove_entry(path: Path) -> None:
    """Remove ``path`` (a file or a folder): renamed to a hidden name beside it first, so the export's name is
    free (or gone) in one step, then deleted.  Gone already: nothing."""
    aside = path.with_name(f".{path.name}.removing-{os.getpid()}-{time.time_ns()}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def enforce_quota(root: str | os.PathLike, quota_bytes: int, max_age_s: float, keep: str | None = None,
                  now: float | None = None) -> QuotaReport:
    """Bound the exports folder ``root`` before an export called ``keep`` is written there: remove every export
    older than ``max_age_s`` seconds (and hidden leftovers older than that), then the oldest exports until the
    folder holds at most ``quota_bytes`` bytes.  ``keep`` (an export name; its zip goes with it) is never removed,
    even when it alone is over the quota.  ``now``: the clock, in seconds since the epoch (default: now)."""
    now = time.time() if now is None else now
    exports, hidden = scan(root)
    report = QuotaReport()
    for h in hidden:
        try:
            old = now - h.lstat().st_mtime > max_age_s
        except OSError:
            continue
        if old and ".removing-" not in h.name:
            remove_entry(h)
    kept = []
    for ex in exports:
        if ex.name != keep and now - ex.mtime > max_age_s:
            _drop(ex, report)
        else:
            kept.append(ex)
    total = sum(ex.size for ex in kept)
    for ex in list(kept):
        if total <= quota_bytes:
            break
        if ex.name == keep:
            continue
        _drop(ex, report)
        total -= ex.size
    report.left = total
    return report


def _drop(ex: Export, report: QuotaReport) -> None:
    for p in ex.paths:
        remove_entry(p)
    report.removed.append(ex.name)
    report.freed += ex.size


def touch(paths) -> None:
    """Mark the entries ``paths`` as used now (an export reused instead of written again is not the oldest)."""
    for p in paths:
        try:
            os.utime(p)
        except OSError:
            pass
