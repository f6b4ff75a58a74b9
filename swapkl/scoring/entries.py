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
:mod:`swapkl.removal.memo` and the GGUF conversion of :mod:`swapkl.model.gguf` share it).
"""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from swapkl import __version__
from swapkl.contract import stable_hash
from swapkl.store import CacheWarning, CorruptEntry, cache_root, read_entry, warn_unwritable, write_entry


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
