"""The one storage layer under swapkl's cache: one root, atomic writes, checksummed and versioned entries.

Everything swapkl keeps between runs goes through here: score entries (:mod:`swapkl.store`), perplexity
evaluations (:mod:`swapkl.measure.memo`), finished dashboard jobs (:mod:`swapkl.jobs.snapshots`), the sha256 memo and
GGUF conversion records (:mod:`swapkl.model.gguf`).  An *entry* is one JSON file::

    {"swapkl_store": <kind>, "version": STORE_VERSION, "checksum": sha256(canonical JSON of data), "data": {...}}

written with :func:`atomic_write_text` (readers see the old file or the whole new one).  Every atomic write of
the project goes through :func:`atomic_path` (one file) or :func:`temp_folder` + :func:`atomic_replace_dir` (a
folder).  :func:`read_entry`
returns ``data`` only when the kind, the version and the checksum match; anything else -- a torn write, a
hand edit, bit rot, another format -- raises :class:`CorruptEntry` with the reason, and the caller recomputes.

The root is ``$SWAPKL_CACHE`` if set, else ``cache/`` in the project checkout, else ``~/.cache/swapkl`` for an
installed package (:func:`cache_root`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from swapkl.contract import stable_hash
from swapkl.errors import ModelLoadError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_CACHE = "SWAPKL_CACHE"
STORE_VERSION = 1


def cache_root() -> Path:
    """The one definition: ``$SWAPKL_CACHE`` if set; else ``cache/`` at the root of a swapkl checkout (the folder
    above the package holds ``pyproject.toml``); else, for an installed package (``pip install swapkl``: the folder
    above it is site-packages), ``$XDG_CACHE_HOME/swapkl`` (default ``~/.cache/swapkl``)."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    if (PROJECT_ROOT / "pyproject.toml").is_file():
        return PROJECT_ROOT / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "swapkl"


class CorruptEntry(ValueError):
    """A stored entry that cannot be used (the message says why); the caller recomputes it."""


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part (a JSON
    entry through :func:`atomic_write_text`, a tensor file, a checkpoint)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """The one atomic write: yields a new temporary file beside ``path`` (``.<name>.XXXX.tmp``, same file system)
    for the caller to write -- directly, or by a writer that wants a path (``gguf.GGUFWriter``); when the block
    ends the file is flushed to disk (``fsync``), made readable by every user (0644: the cache is shared) and
    renamed onto ``path`` in one step, so readers see the old file or the whole new one.  If the block raises,
    the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache must be readable by every user
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def temp_folder(parent: str | os.PathLike, prefix: str) -> Iterator[Path]:
    """A new folder ``<parent>/<prefix>XXXX.tmp`` (0755: the cache is shared) for writing a folder beside where it
    will go; removed with everything in it if the block raises.  The caller moves it into place
    (:func:`atomic_replace_dir`, or file by file) or keeps it."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_replace_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Put the finished folder ``tmp`` at ``final`` (same filesystem), replacing an old one: readers see the
    old folder or the whole new one.  The old one is first renamed aside, then deleted."""
    final = Path(final)
    if final.exists():
        stale = final.with_name(f".{final.name}.stale-{os.getpid()}-{time.time_ns()}")
        os.replace(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.replace(tmp, final)


def dump_json(data, path: str | os.PathLike | None = None, indent: int | None = None) -> str:
    """``data`` as strict JSON text (NaN/inf refused), also written atomically to ``path`` when given: the
    ``to_json`` of every result type."""
    s = json.dumps(data, indent=indent, allow_nan=False)
    if path is not None:
        atomic_write_text(path, s)
    return s


def checksum(data) -> str:
    """sha256 (hex, first 32 digits) of the canonical JSON of ``data``."""
    return stable_hash(data)[:32]


def write_entry(path: str | os.PathLike, kind: str, data: dict, indent: int | None = None) -> None:
    """Store ``data`` (a JSON-able dict) as an entry of ``kind`` at ``path``, atomically.  Non-finite floats are
    kept as Python's JSON extension (the cache is read by swapkl only; exports use strict JSON)."""
    if not isinstance(data, dict):
        raise TypeError(f"an entry holds a dict, not {type(data).__name__}")
    text = json.dumps({"swapkl_store": kind, "version": STORE_VERSION, "checksum": checksum(data), "data": data},
                      indent=indent)
    atomic_write_text(path, text)


def read_entry(path: str | os.PathLike, kind: str) -> dict | None:
    """The ``data`` of the entry of ``kind`` at ``path``; None when there is no file.  Raises
    :class:`CorruptEntry` when it cannot be read or is not a whole, current entry of that kind."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptEntry(f"unreadable ({e})") from None
    try:
        d = json.loads(text)
    except ValueError as e:
        raise CorruptEntry(f"unreadable ({e})") from None
    if not isinstance(d, dict) or "swapkl_store" not in d:
        raise CorruptEntry("not a swapkl store entry")
    if d.get("swapkl_store") != kind:
        raise CorruptEntry(f"a {d.get('swapkl_store')!r} entry where a {kind!r} entry belongs")
    if d.get("version") != STORE_VERSION:
        raise CorruptEntry(f"store version {d.get('version')!r}, this swapkl reads {STORE_VERSION}")
    data = d.get("data")
    if not isinstance(data, dict) or d.get("checksum") != checksum(data):
        raise CorruptEntry("checksum mismatch")
    return data


def read_entry_or_empty(path: str | os.PathLike, kind: str) -> dict:
    """:func:`read_entry`, with a missing or damaged entry read as ``{}`` (memo tables that are rebuilt)."""
    try:
        return read_entry(path, kind) or {}
    except CorruptEntry:
        return {}


# ----------------------------------------------------------------------------- unwritable roots, file fingerprints
class CacheWarning(UserWarning):
    """Something about the cache the user should know (a corrupt entry, an unwritable root); never fatal."""


_WARNED_UNWRITABLE: set[str] = set()


def _root_of(path: Path) -> Path:
    root = cache_root()
    try:
        Path(path).relative_to(root)
        return root
    except ValueError:
        return Path(path)


def warn_unwritable(path: str | os.PathLike, err: OSError) -> str:
    """Warn (:class:`CacheWarning`, once per process and cache root) that writing ``path`` failed with ``err`` and
    the run goes on without caching; returns the message."""
    root = _root_of(Path(path))
    msg = (f"cannot write the cache under {root} ({type(err).__name__}: {err.strerror or err}); computing without "
           "caching (set SWAPKL_CACHE to a writable folder)")
    if str(root) not in _WARNED_UNWRITABLE:
        _WARNED_UNWRITABLE.add(str(root))
        warnings.warn(msg, CacheWarning, stacklevel=3)
    return msg


def writable_error(folder: str | os.PathLike) -> OSError | None:
    """None if a file can be created in ``folder`` (made if missing), else the error (a cheap probe, no data)."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return e
    return None


# ----------------------------------------------------------------------------- file fingerprints
SHA_MEMO_FILE = "sha256.json"
SHA_MEMO_KIND = "sha256-memo"


def file_sha256(path: str | os.PathLike, root: str | os.PathLike | None = None, memo: bool = True) -> str:
    """Hex sha256 of a file's bytes (the one implementation; :func:`swapkl.model.gguf.sha256_file` wraps it).

    With ``memo`` (default) the digest is remembered in ``<root>/sha256.json`` (``root`` defaults to
    :func:`cache_root`) under the file's resolved path together with its size (bytes) and mtime (ns); it is
    reused only while both are unchanged.  A file that cannot be read raises :class:`~swapkl.errors.ModelLoadError`.
    """
    p = Path(path).expanduser().resolve()
    try:
        st = p.stat()
    except OSError as e:
        raise ModelLoadError(f"cannot read {p}: {e.strerror or e}") from e
    memo_path = Path(root or cache_root()) / SHA_MEMO_FILE
    key = str(p)
    if memo:
        hit = read_entry_or_empty(memo_path, SHA_MEMO_KIND).get(key)
        if isinstance(hit, dict) and hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns \
                and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    except OSError as e:
        raise ModelLoadError(f"cannot read {p}: {e.strerror or e}") from e
    digest = h.hexdigest()
    if memo:
        with contextlib.suppress(OSError):
            table = read_entry_or_empty(memo_path, SHA_MEMO_KIND)  # re-read: another process may have added some
            table[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
            write_entry(memo_path, SHA_MEMO_KIND, table, indent=1)
    return digest


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def folder_fingerprint(folder: str | os.PathLike) -> str:
    """Content hash of a model folder: its config and weight files (names and sha256)."""
    folder = Path(folder)
    parts = []
    for f in sorted(folder.iterdir()):
        if f.is_file() and (f.name == "config.json" or f.suffix in WEIGHT_SUFFIXES):
            parts.append((f.name, file_sha256(f)))
    return stable_hash(parts)
