"""On-disk cache of swap-KL results, shared by the CLI and the dashboard.

Layout: ``<root>/scores/<key>/`` where ``key`` hashes the model identity, the contract settings that
determine per-pair values (:meth:`Contract.key`) and the swapkl version.  Inside: ``meta.json`` (identity,
contract key, prompt token ids) and one ``pairs/<i>-<j>.json`` per finished pair holding its three
per-prompt KL vectors and a checksum.  Pairs are written atomically as they finish, so an interrupted run
loses nothing and resumes where it stopped, a wider pair set reuses the narrower one's pairs, and several
processes (ranks) can fill one entry at once.  A corrupt pair file is reported, deleted and recomputed.

The root is ``$SWAPKL_CACHE`` if set, else ``cache/`` in the project.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from swapkl import __version__
from swapkl.contract import stable_hash
from swapkl.results import atomic_write_text

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    env = os.environ.get("SWAPKL_CACHE")
    return Path(env).expanduser() if env else PROJECT_ROOT / "cache"


# ----------------------------------------------------------------------------- file fingerprints
def file_sha256(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file's content, memoised on disk by (path, size, mtime_ns) (see
    :func:`swapkl.gguf.sha256_file`, the one implementation)."""
    from swapkl.gguf import sha256_file

    return sha256_file(path)


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
def _checksum(vectors: dict) -> str:
    return stable_hash({k: [round(float(x), 12) for x in vectors[k]] for k in sorted(vectors)})


class ScoreEntry:
    """One cache entry: a (model, contract key, version) with any number of finished pairs."""

    def __init__(self, identity: dict, contract_key: dict, root: Path | None = None):
        self.identity = identity
        self.contract_key = contract_key
        ident = {k: v for k, v in identity.items() if k in ("kind", "id", "revision", "commit", "fingerprint")}
        self.key = stable_hash({"model": ident, "contract": contract_key, "version": __version__})[:20]
        self.dir = (root or cache_root()) / "scores" / self.key
        self.problems: list[str] = []

    @property
    def pairs_dir(self) -> Path:
        return self.dir / "pairs"

    def write_meta(self, meta: dict) -> None:
        atomic_write_text(self.dir / "meta.json", json.dumps(
            {"identity": self.identity, "contract_key": self.contract_key, "swapkl_version": __version__, **meta}))

    def read_meta(self) -> dict | None:
        try:
            return json.loads((self.dir / "meta.json").read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as e:
            self._problem(self.dir / "meta.json", f"unreadable ({e})")
            return None

    def _problem(self, path: Path, why: str) -> None:
        msg = f"corrupt cache entry {path}: {why}; it will be recomputed"
        self.problems.append(msg)
        warnings.warn(msg, stacklevel=3)
        try:
            path.unlink()
        except OSError:
            pass

    def pair_path(self, i: int, j: int) -> Path:
        return self.pairs_dir / f"{i}-{j}.json"

    def write_pair(self, i: int, j: int, vectors: dict) -> None:
        vec = {k: [float(x) for x in vectors[k]] for k in ("repl_ij", "repl_ji", "inter")}
        atomic_write_text(self.pair_path(i, j), json.dumps({"i": i, "j": j, **vec, "checksum": _checksum(vec)}))

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
                d = json.loads(f.read_text())
                vec = {k: d[k] for k in ("repl_ij", "repl_ji", "inter")}
                if (d["i"], d["j"]) != (i, j) or any(len(v) != num_prompts for v in vec.values()):
                    raise ValueError("wrong shape")
                if d.get("checksum") != _checksum(vec):
                    raise ValueError("checksum mismatch")
            except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                self._problem(f, str(e))
                continue
            out[(i, j)] = vec
        return out

    def clear(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)
