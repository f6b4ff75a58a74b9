"""On-disk cache of swap-KL results, shared by the CLI and the dashboard.

Layout: ``<root>/scores/<key>/`` where ``key`` hashes the model identity, the contract settings that
determine per-pair values (:meth:`Contract.key`) and the swapkl version.  Inside: ``meta.json`` (identity,
contract key, prompt token ids, noise floor) and ``pairs/chunk-<hash>.json`` files, one per chunk of pairs the
engine finished together, each holding those pairs' three per-prompt KL vectors, the digest of the prompt token
ids they were computed on, and a checksum.  A chunk is written in one durable write (atomic and fsynced) as it
finishes, so an interrupted run loses at most the chunk in flight and resumes where it stopped, a wider pair set
reuses the narrower one's pairs, and several processes (ranks) can fill one entry at once.  A chunk made on other
prompts (another tokenizer under the same key) is ignored, never deleted; a corrupt chunk is reported, deleted
and recomputed.

The root is ``$SWAPKL_CACHE`` if set, else ``cache/`` in the project.  A root that cannot be written (read-only,
no space, a regular file in its path) is not an error: everything is computed without caching, and
:func:`warn_unwritable` says so once per process and root (the score cache, the perplexity memo of
:mod:`swapkl.measure.memo` and the GGUF conversion of :mod:`swapkl.model.gguf` share it).
"""
from __future__ import annotations

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

    def chunk_path(self, pairs, prompts: str) -> Path:
        """Where the chunk of ``pairs`` computed on the prompts of digest ``prompts`` is stored."""
        return self.pairs_dir / f"chunk-{stable_hash([sorted(list(p) for p in pairs), prompts])[:20]}.json"

    def write_pairs(self, vectors: dict, prompts: str) -> None:
        """One durable write (atomic, fsynced) of every pair in ``vectors`` ``{(i, j): {"repl_ij", "repl_ji",
        "inter"}}`` (per-prompt KLs, nats) computed on the prompts of digest ``prompts``."""
        if not vectors:
            return
        pairs = sorted(vectors)
        data = {"prompts": prompts, "pairs": [list(p) for p in pairs]}
        for k in ("repl_ij", "repl_ji", "inter"):
            data[k] = [[float(x) for x in vectors[p][k]] for p in pairs]
        self._write(self.chunk_path(pairs, prompts), "score-chunk", data)

    def read_pairs(self, num_prompts: int, wanted=None, prompts: str | None = None, legacy: bool = False) -> dict:
        """Finished pairs ``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` (lists of floats, nats) computed on the
        prompts of digest ``prompts`` (any, when None); chunks of other prompts are skipped and kept, corrupt
        ones (bad JSON, wrong length, checksum mismatch) are reported in ``problems`` and removed.  With
        ``legacy``, also the one-file-per-pair ``<i>-<j>.json`` files swapkl wrote before chunks (they carry no
        digest: the caller knows from the entry's meta that they were made on these prompts)."""
        out = {}
        if not self.pairs_dir.is_dir():
            return out
        wanted = None if wanted is None else {tuple(p) for p in wanted}
        if legacy:
            out.update(self._read_legacy(num_prompts, wanted))
        for f in sorted(self.pairs_dir.glob("chunk-*.json")):
            try:
                d = read_entry(f, "score-chunk")  # CorruptEntry (a ValueError): torn, edited, old format
                if d is None:
                    continue  # removed meanwhile
                pairs = [(int(p[0]), int(p[1])) for p in d["pairs"]]
                vecs = {k: d[k] for k in ("repl_ij", "repl_ji", "inter")}
                if any(len(v) != len(pairs) or any(len(x) != num_prompts for x in v) for v in vecs.values()):
                    raise ValueError("wrong shape")
                if not isinstance(d["prompts"], str):
                    raise ValueError("no prompt digest")
            except (OSError, KeyError, TypeError, ValueError, IndexError) as e:
                self._problem(f, str(e))
                continue
            if prompts is not None and d["prompts"] != prompts:
                continue
            for n, p in enumerate(pairs):
                if wanted is None or p in wanted:
                    out[p] = {k: v[n] for k, v in vecs.items()}
        return out

    def _read_legacy(self, num_prompts: int, wanted) -> dict:
        """The ``<i>-<j>.json`` pair files of swapkl before chunks (kind ``score-pair``)."""
        out = {}
        for f in self.pairs_dir.glob("*-*.json"):
            try:
                i, j = (int(x) for x in f.stem.split("-"))
            except ValueError:
                continue
            if wanted is not None and (i, j) not in wanted:
                continue
            try:
                d = read_entry(f, "score-pair")
                if d is None:
                    continue
                vec = {k: d[k] for k in ("repl_ij", "repl_ji", "inter")}
                if (d["i"], d["j"]) != (i, j) or any(len(v) != num_prompts for v in vec.values()):
                    raise ValueError("wrong shape")
            except (OSError, KeyError, TypeError, ValueError) as e:
                self._problem(f, str(e))
                continue
            out[(i, j)] = vec
        return out

def prompts_digest(prompt_token_ids) -> str:
    """The digest of a prompt set (its token ids, [P][T] nested lists) that cached pairs are filed under."""
    return stable_hash([[int(t) for t in row] for row in prompt_token_ids])[:32]
