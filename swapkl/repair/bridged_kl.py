"""Bridged swap-KL, the third matrix: for every span ``[i, j)`` of a contract's pair set (and every span that runs
to the last block), KL(base ‖ blocks i..j−1 replaced by their bridge) and the same span removed without a bridge,
per prompt, on the contract's prompts, positions and aggregation, with prompt-bootstrap CIs (docs/repair.md).

:func:`bridged_scores` is the front door: prompts → cache → calibration + fits of the missing spans → sweep
(:class:`~swapkl.repair.sweep.BridgedSweep`) → :class:`BridgedResult`.  Finished spans are cached one durable entry per
chunk (kind ``bridged-chunk``) under a key of the model, the contract, the bridge settings and the prompts, so an
interrupted run resumes where it stopped; ``shard=(rank, world)`` computes every world-th span (a torchrun rank).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from swapkl import __version__
from swapkl.contract import Contract, stable_hash
from swapkl.errors import ContractError
from swapkl.repair.settings import BridgeSettings
from swapkl.stats import bootstrap_indices, percentile_ci
from swapkl.store import CorruptEntry, cache_root, read_entry, warn_unwritable, write_entry

FORMAT = "swapkl.bridged/1"
KIND = "bridged-chunk"


def bridge_spans(contract: Contract, num_layers: int, pairs=None) -> list[tuple[int, int]]:
    """The spans of the third matrix: each pair ``(i, j)`` of the pair set (or ``pairs``) as the span ``[i, j)``,
    and every span ``[i, L)`` to the last block (i ≥ 1: something must stay), shortest first."""
    L = num_layers
    spans = {tuple(p) for p in (pairs if pairs is not None else contract.pair_list(L))}
    spans |= {(i, L) for i in range(1, L)}
    return sorted(spans, key=lambda s: (s[1] - s[0], s[0]))


@dataclass
class BridgedResult:
    """Per-span vectors ``spans[(i, j)] = {"bridged": [P], "raw": [P], "fit": {...}}`` (nats) and the contract."""

    num_layers: int
    spans: dict
    contract: dict
    settings: dict
    identity: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def mean(self, span, which: str = "bridged") -> float:
        return float(np.mean(self.spans[tuple(span)][which]))

    def ci(self, span, which: str = "bridged", n_boot: int = 1000, seed: int = 0) -> list[float]:
        """The 95 % prompt-bootstrap interval of the span's mean KL (project-wide resamples and seed)."""
        v = np.asarray(self.spans[tuple(span)][which], dtype=float)
        return percentile_ci(v[bootstrap_indices(len(v), n_boot, seed)].mean(1))

    def matrix(self, which: str = "bridged") -> np.ndarray:
        """[L, L+1] mean KL of span ``[i, j)`` at ``[i, j]`` (NaN where not computed)."""
        m = np.full((self.num_layers, self.num_layers + 1), np.nan)
        for (i, j), v in self.spans.items():
            m[i, j] = float(np.mean(v[which]))
        return m

    def to_dict(self) -> dict:
        return {"format": FORMAT, "num_layers": self.num_layers, "contract": self.contract, "settings": self.settings,
                "identity": self.identity, "calibration": self.calibration, "meta": self.meta,
                "spans": [{"span": [i, j], **v} for (i, j), v in sorted(self.spans.items())]}

    def to_json(self, path=None) -> str:
        """Strict JSON (atomic write to ``path`` when given)."""
        from swapkl.store import dump_json

        return dump_json(self.to_dict(), path)

    def rows(self) -> list[dict]:
        """One row per span, shortest first: bridged and raw mean KL with their 95 % prompt-bootstrap CIs, the form
        and the fit residual."""
        out = []
        for s in sorted(self.spans, key=lambda s: (s[1] - s[0], s[0])):
            fit = self.spans[s].get("fit", {})
            out.append({"span": list(s), "bridged": self.mean(s), "bridged_ci": self.ci(s), "raw": self.mean(s, "raw"),
                        "raw_ci": self.ci(s, "raw"), "form": fit.get("form"), "residual": fit.get("residual")})
        return out

    @classmethod
    def from_dict(cls, d: dict) -> BridgedResult:
        """Validated first (:func:`swapkl.schema.bridged.bridged_result`: one line naming the first problem)."""
        from swapkl.schema.bridged import bridged_result

        d = bridged_result(d)
        spans = {(int(s["span"][0]), int(s["span"][1])): {k: v for k, v in s.items() if k != "span"}
                 for s in d["spans"]}
        return cls(int(d["num_layers"]), spans, d["contract"], d["settings"], d.get("identity", {}),
                   d.get("calibration", {}), d.get("meta", {}))

    @classmethod
    def from_json(cls, path) -> BridgedResult:
        from swapkl.schema.text import read_json_file

        return cls.from_dict(read_json_file(path, "bridged swap-KL file"))


def _entry_dir(checkpoint, contract: Contract, corpus, settings: BridgeSettings, digest: str):
    ident = {k: v for k, v in checkpoint.identity.items() if k in ("kind", "id", "revision", "commit", "fingerprint")}
    key = stable_hash({"model": ident, "contract": contract.key(corpus.sha256), "bridge": settings.to_dict(),
                       "prompts": digest, "version": __version__})[:20]
    return cache_root() / "bridged" / key


def _read_cached(folder, num_prompts: int) -> dict:
    out: dict = {}
    for f in sorted(folder.glob("chunk-*.json")) if folder.is_dir() else []:
        try:
            d = read_entry(f, KIND) or {}
            for s in d.get("spans", []):
                if len(s["bridged"]) != num_prompts or len(s["raw"]) != num_prompts:
                    raise CorruptEntry("wrong shape")
                out[(int(s["span"][0]), int(s["span"][1]))] = {k: v for k, v in s.items() if k != "span"}
        except (CorruptEntry, KeyError, TypeError, ValueError, IndexError):
            f.unlink(missing_ok=True)  # recomputed
    return out


def bridged_scores(checkpoint, contract: Contract, settings: BridgeSettings | None = None, progress=None,
                   use_cache: bool = True, pairs=None, shard: tuple[int, int] | None = None,
                   engine_kw: dict | None = None, should_stop=None) -> BridgedResult:
    """The third matrix on ``contract`` (module docstring); ``progress(done, total, what)`` counts spans."""
    from swapkl.scoring.entries import prompts_digest
    from swapkl.scoring.score import contract_prompts

    t_start = time.perf_counter()
    settings = settings or BridgeSettings()
    if contract.unit != "block":
        raise ContractError("bridged swap-KL replaces whole blocks: use --unit block")
    if contract.dtype != checkpoint.dtype:
        raise ContractError(f"the contract asks for {contract.dtype} but the model was loaded as {checkpoint.dtype}")
    L = checkpoint.num_layers
    spans = bridge_spans(contract, L, pairs)
    corpus, prompts, _ = contract_prompts(checkpoint, contract)
    digest = prompts_digest(prompts.ids.tolist())
    folder = _entry_dir(checkpoint, contract, corpus, settings, digest)
    done = _read_cached(folder, contract.prompts) if use_cache else {}
    todo = [s for k, s in enumerate(spans) if shard is None or k % shard[1] == shard[0]]
    todo = [s for s in todo if s not in done]
    calib_desc, fit_seconds = _compute(checkpoint, contract, settings, corpus, prompts, todo, folder, done,
                                       use_cache, engine_kw, progress, should_stop) if todo else ({}, 0.0)
    wanted = spans if shard is None else [s for k, s in enumerate(spans) if k % shard[1] == shard[0]]
    meta = {"swapkl_version": __version__, "computed_spans": len(todo), "cached_spans": len(wanted) - len(todo),
            "fit_seconds": fit_seconds, "seconds": time.perf_counter() - t_start, "device": str(checkpoint.device)}
    return BridgedResult(L, {s: done[s] for s in wanted if s in done},
                         contract.to_dict() | {"corpus_label": corpus.label, "corpus_sha256": corpus.sha256},
                         settings.to_dict(), checkpoint.identity, calib_desc, meta)


def cache_spans(checkpoint, contract: Contract, settings: BridgeSettings, spans: dict) -> None:
    """Store spans computed elsewhere (by another torchrun rank), ``{(i, j): {"bridged", "raw", "fit"}}``, in this
    checkpoint's cache entry for ``contract`` and ``settings`` as one chunk; an unwritable cache is a warning."""
    from swapkl.scoring.entries import prompts_digest
    from swapkl.scoring.score import contract_prompts

    corpus, prompts, _ = contract_prompts(checkpoint, contract)
    folder = _entry_dir(checkpoint, contract, corpus, settings, prompts_digest(prompts.ids.tolist()))
    path = folder / f"chunk-{stable_hash(sorted(spans))[:20]}.json"
    try:
        write_entry(path, KIND, {"spans": [{"span": list(s), **v} for s, v in sorted(spans.items())]})
    except OSError as e:
        warn_unwritable(path, e)


def _compute(checkpoint, contract: Contract, settings: BridgeSettings, corpus, prompts, todo, folder, done: dict,
             use_cache: bool, engine_kw, progress, should_stop) -> tuple[dict, float]:
    """Calibrate, fit and sweep the spans ``todo``, adding them to ``done`` and the cache chunk by chunk; returns the
    calibration's description and the seconds the fits took."""
    import torch

    from swapkl.repair.bridge import captured_blocks
    from swapkl.repair.bridger import Bridger
    from swapkl.repair.sweep import BridgedSweep
    from swapkl.scoring.score import kl_impl_setting

    bridger = Bridger(checkpoint.model, checkpoint.tokenizer, corpus, settings, contract, prompts)
    t0 = time.perf_counter()
    bridges = dict(zip(todo, bridger.span_bridges(todo)))
    fit_seconds = time.perf_counter() - t0
    for s in todo:
        bridges[s].fit["form_note"] = bridger.forms[s][1]
    sweep = BridgedSweep(checkpoint.model, prompts.ids, contract.positions, getattr(torch, contract.kl_dtype),
                         kl_impl=kl_impl_setting(engine_kw), folded=captured_blocks(bridges.values()),
                         **{k: v for k, v in (engine_kw or {}).items() if k in ("max_rows", "max_live")})
    writable = [use_cache]

    def on_chunk(vecs):
        rows = [{"span": list(s), "bridged": v["bridged"].tolist(), "raw": v["raw"].tolist(),
                 "fit": bridges[s].summary()} for s, v in sorted(vecs.items())]
        for r in rows:
            done[tuple(r["span"])] = {k: r[k] for k in ("bridged", "raw", "fit")}
        if writable[0]:
            path = folder / f"chunk-{stable_hash(sorted(vecs))[:20]}.json"
            try:
                write_entry(path, KIND, {"spans": rows})
            except OSError as e:
                writable[0] = False
                warn_unwritable(path, e)

    sweep.sweep([bridges[s] for s in todo], on_chunk=on_chunk, progress=progress, should_stop=should_stop)
    return bridger.calibration(), fit_seconds
