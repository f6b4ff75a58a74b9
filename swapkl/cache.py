"""On-disk cache of swap-KL results, shared by the CLI and the dashboard.

Layout: ``<root>/scores/<key>/`` where ``key`` hashes the model identity, the contract settings that
determine per-pair values (:meth:`Contract.key`) and the swapkl version.  Inside: ``meta.json`` (identity,
contract key, prompt token ids) and one ``pairs/<i>-<j>.json`` per finished pair holding its three
per-prompt KL vectors and a checksum.  Pairs are written atomically as they finish, so an interrupted run
loses nothing and resumes where it stopped, a wider pair set reuses the narrower one's pairs, and several
processes (ranks) can fill one entry at once.  A corrupt pair file is reported, deleted and recomputed.

The root is ``$SWAPKL_CACHE`` if set, else ``cache/`` in the project.  A root that cannot be written (read-only,
no space, a regular file in its path) is not an error: everything is computed without caching, and
:func:`warn_unwritable` says so once per process and root (the score cache, the perplexity memo of
:mod:`swapkl.memo` and the GGUF conversion of :mod:`swapkl.gguf` share it).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from swapkl import __version__
from swapkl.contract import stable_hash
from swapkl.errors import ModelLoadError
from swapkl.store import PROJECT_ROOT, CorruptEntry, cache_root, read_entry, read_entry_or_empty, write_entry

__all__ = ["PROJECT_ROOT", "CacheWarning", "ScoreEntry", "cache_root", "file_sha256", "folder_fingerprint",
           "warn_unwritable", "writable_error"]


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
    """Hex sha256 of a file's bytes (the one implementation; :func:`swapkl.gguf.sha256_file` wraps it).

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


# ----------------------------------------------------------------------------- score entries
class ScoreEntry:
    """One cache entry: a (model, contract key, version) with any number of finished pairs."""

    def __init__(self, identity: dict, contract_key: dict, root: Path | None = None):
        self.identity = identity
        self.contract_key = contract_key
        ident = {k: v for k, v in identity.items() if k in ("kind", "id", "revision", "commit", "fingerprint")}
        self.key = stable_hash({"model": ident, "contract": contract_key, "version": __version__})[:20]
        self.dir = (root or cache_root()) / "scores" / self.key
        self.problems: list[str] = []
        self.writable = True  # False after the first failed write: the rest of the run computes without caching

    @property
    def pairs_dir(self) -> Path:
        return self.dir / "pairs"

    def _write(self, path: Path, kind: str, data: dict) -> None:
        if not self.writable:
            return
        try:
            write_entry(path, kind, data)
        except OSError as e:
            self.writable = False
            self.problems.append(warn_unwritable(path, e))

    def write_meta(self, meta: dict) -> None:
        self._write(self.dir / "meta.json", "score-meta",
                    {"identity": self.identity, "contract_key": self.contract_key, "swapkl_version": __version__,
                     **meta})

    def read_meta(self) -> dict | None:
        try:
            return read_entry(self.dir / "meta.json", "score-meta")
        except CorruptEntry as e:
            self._problem(self.dir / "meta.json", str(e))
            return None

    def _problem(self, path: Path, why: str) -> None:
        msg = f"corrupt cache entry {path}: {why}; it will be recomputed"
        self.problems.append(msg)
        warnings.warn(msg, CacheWarning, stacklevel=3)
        try:
            path.unlink()
        except OSError:
            pass

    def pair_path(self, i: int, j: int) -> Path:
        return self.pairs_dir / f"{i}-{j}.json"

    def write_pair(self, i: int, j: int, vectors: dict) -> None:
        vec = {k: [float(x) for x in vectors[k]] for k in ("repl_ij", "repl_ji", "inter")}
        self._write(self.pair_path(i, j), "score-pair", {"i": i, "j": j, **vec})

    def read_pairs(self, num_prompts: int, wanted=None) -> dict:
        """Finished pairs ``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` (lists of floats, nats); corrupt
        files (bad JSON, wrong length, checksum mismatch) are reported in ``problems`` and removed."""
        out = {}
        if not self.pairs_dir.is_dir():
            return out
        wanted = None if wanted is None else {tuple(p) for p in wanted}
        for f in self.pairs_dir.glob("*-*.json"):
            try:
                i, j = (int(x) for x in f.stem.split("-"))
            except ValueError:
                continue
            if wanted is not None and (i, j) not in wanted:
                continue
            try:
                d = read_entry(f, "score-pair")  # CorruptEntry (a ValueError): torn, edited, old format
                vec = {k: d[k] for k in ("repl_ij", "repl_ji", "inter")}
                if (d["i"], d["j"]) != (i, j) or any(len(v) != num_prompts for v in vec.values()):
                    raise ValueError("wrong shape")
            except (OSError, KeyError, TypeError, ValueError) as e:
                self._problem(f, str(e))
                continue
            out[(i, j)] = vec
        return out

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
