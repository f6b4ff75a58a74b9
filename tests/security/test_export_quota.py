"""The quota of a demo server's exports folder (:mod:`swapkl.jobs.export_quota`) on real folders: sizes are the bytes
written, ages are the files' modification times (set with ``os.utime``), nothing is stubbed."""
from __future__ import annotations

import os
import time
from pathlib import Path

from swapkl.jobs.export_quota import enforce_quota, entry_size, scan

NOW = time.time()
H = 3600.0


def _export(root: Path, name: str, sizes: dict, age_h: float, zip_bytes: int = 0) -> int:
    """A folder export ``name`` with files ``{relative name: bytes}`` (and a ``name.zip`` of ``zip_bytes``), every
    entry ``age_h`` hours old; returns the bytes written."""
    folder = root / name
    for rel, n in sizes.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(os.urandom(n))
    entries = [folder, *folder.rglob("*")]
    if zip_bytes:
        (root / f"{name}.zip").write_bytes(os.urandom(zip_bytes))
        entries.append(root / f"{name}.zip")
    for p in entries:
        os.utime(p, (NOW - age_h * H, NOW - age_h * H))
    return sum(sizes.values()) + zip_bytes


def _left(root: Path) -> int:
    return sum(entry_size(p) for p in root.iterdir() if not p.name.startswith("."))


def test_sizes_and_ages_are_measured_on_the_disk(tmp_path):
    a = _export(tmp_path, "a", {"model.safetensors": 70_000, "sub/config.json": 300}, 5, zip_bytes=70_400)
    (tmp_path / "a" / "link").symlink_to(tmp_path / "a" / "model.safetensors")   # not counted, not followed
    os.utime(tmp_path / "a", (NOW - 5 * H, NOW - 5 * H))
    (tmp_path / "b.yaml").write_text("slices: []\n")
    os.utime(tmp_path / "b.yaml", (NOW - H, NOW - H))
    exports, hidden = scan(tmp_path)
    assert [(e.name, e.size) for e in exports] == [("a", a), ("b.yaml", len("slices: []\n"))]     # oldest first, zip with its folder
    assert a == 140_700 and abs(exports[0].mtime - (NOW - 5 * H)) < 1 and hidden == []


def test_old_exports_go_first_then_the_oldest_until_under_the_quota(tmp_path):
    old = _export(tmp_path, "old", {"w": 50_000}, 30, zip_bytes=50_000)       # past 24 h: removed at any size
    e1 = _export(tmp_path, "e1", {"w": 300_000}, 10, zip_bytes=300_000)
    e2 = _export(tmp_path, "e2", {"w": 200_000}, 5, zip_bytes=200_000)
    e3 = _export(tmp_path, "e3", {"w": 100_000}, 1, zip_bytes=100_000)
    assert _left(tmp_path) == old + e1 + e2 + e3 == 1_300_000
    rep = enforce_quota(tmp_path, quota_bytes=700_000, max_age_s=24 * H, keep="new", now=NOW)
    assert rep.removed == ["old", "e1"] and rep.freed == old + e1 == 700_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2", "e2.zip", "e3", "e3.zip"]
    assert _left(tmp_path) == rep.left == e2 + e3 == 600_000 <= 700_000
    # under the quota and young: nothing more goes
    assert enforce_quota(tmp_path, 700_000, 24 * H, now=NOW).removed == []


def test_the_export_being_written_is_never_removed(tmp_path):
    keep = _export(tmp_path, "mine", {"w": 500_000}, 48, zip_bytes=500_000)    # old and alone over the quota
    other = _export(tmp_path, "other", {"w": 10_000}, 1)
    rep = enforce_quota(tmp_path, quota_bytes=100_000, max_age_s=24 * H, keep="mine", now=NOW)
    assert rep.removed == ["other"] and rep.freed == other
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "mine.zip"] and _left(tmp_path) == keep == rep.left


def test_a_folder_being_written_is_left_alone_and_removals_leave_no_half_folder(tmp_path):
    _export(tmp_path, "done", {"w": 400_000}, 2)
    writing = tmp_path / ".next.abcd.tmp"          # swapkl.store.temp_folder: another job writes here
    (writing / "next").mkdir(parents=True)
    (writing / "next" / "model.safetensors").write_bytes(os.urandom(300_000))
    crashed = tmp_path / ".dead.efgh.tmp"          # a crashed writer's leftover, two days old
    crashed.mkdir()
    (crashed / "w").write_bytes(b"x" * 10)
    os.utime(crashed, (NOW - 48 * H, NOW - 48 * H))
    rep = enforce_quota(tmp_path, quota_bytes=0, max_age_s=24 * H, keep="next", now=NOW)
    assert rep.removed == ["done"] and rep.left == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".next.abcd.tmp"]     # no ".removing-" rest either
    assert entry_size(writing) == 300_000


def test_a_missing_folder_is_an_empty_one(tmp_path):
    rep = enforce_quota(tmp_path / "exports", 1, 1)
    assert (rep.removed, rep.freed, rep.left) == ([], 0, 0)
