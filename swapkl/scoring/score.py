"""The library's front door: score a checkpoint under a contract, through the cache.

>>> ck = load_checkpoint("../shared/models/stories260K")
>>> res = score(ck, Contract(pairs="all", prompts=8, tokens=32))
>>> res.replacement()   # L x L, nats
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Callable

import torch

from swapkl import __version__
from swapkl.scoring.entries import ScoreEntry, prompts_digest
from swapkl.scoring.kl import KL_IMPLS
from swapkl.model.checkpoints import Checkpoint, load_checkpoint  # noqa: F401  (re-exported)
from swapkl.contract import Contract
from swapkl.scoring.corpora import load_corpus
from swapkl.scoring.engine import noise_floor, precision_floor, ProgressFn, SwapEngine
from swapkl.scoring.slots import BlockRunner, undefined_moves
from swapkl.errors import ContractError, is_oom
from swapkl.scoring.prompts import make_prompts
from swapkl.scoring.results import SwapResult
from swapkl.model.architectures import check_context, locate
from swapkl.model.units import layout_for
from swapkl.scoring.memory import engine_limits


def _model_devices(model: torch.nn.Module) -> list[torch.device]:
    return sorted({p.device for p in model.parameters()}, key=str)


def score(checkpoint: Checkpoint, contract: Contract, progress: ProgressFn | None = None,
          should_stop: Callable[[], bool] | None = None, use_cache: bool = True,
          on_partial: Callable[[SwapResult], None] | None = None, pairs=None, shard: tuple[int, int] | None = None,
          engine_kw: dict | None = None, metadata: bool = True) -> SwapResult:
    """Both protocols on ``contract``'s pair set (or ``pairs``), reusing every cached pair.

    ``progress(done, total, what)`` counts variants (3 per pair; cached pairs count as done at once);
    ``on_partial(result)`` receives the result so far after each finished pair (adjacent pairs first);
    ``shard=(rank, world)`` computes only every world-th missing pair (a distributed run's share);
    ``should_stop()`` stops the sweep (raises :class:`ComputeInterrupted`; finished pairs stay cached);
    ``metadata=False`` neither measures the noise floor nor writes the entry's ``meta.json`` (a distributed
    worker: rank 0 is the one writer); ``engine_kw`` goes to :class:`SwapEngine` (sizes, ``kl_impl``: the KL
    implementation, default ``$SWAPKL_KL`` or ``auto``, recorded in ``meta["engine"]["kl"]``).
    ``contract.unit`` (block, attention, mlp) is what each protocol moves; a family without validated sublayers
    raises :class:`~swapkl.model.units.UnsupportedUnit` (one line) before any work.
    Raises :class:`ContractError` before any work when ``contract.tokens`` exceeds the model's context."""
    sweep = _Sweep(checkpoint, contract, progress, use_cache, on_partial, pairs, shard, metadata)
    if sweep.todo or sweep.rewrite_meta:
        engine = sweep.engine(engine_kw)
        if sweep.todo:
            sweep.run(engine, should_stop)
    return sweep.result()


def contract_prompts(checkpoint: Checkpoint, contract: Contract):
    """``(corpus, prompts, cache entry)`` of ``contract`` on ``checkpoint`` (its tokenizer cuts the prompts)."""
    corpus = load_corpus(contract.corpus)
    prompts = make_prompts(checkpoint.tokenizer, corpus, contract.prompts, contract.tokens, contract.seed, contract.bos)
    return corpus, prompts, ScoreEntry(checkpoint.identity, contract.key(corpus.sha256))


def prompts_fingerprint(checkpoint: Checkpoint, contract: Contract) -> dict:
    """What every rank of a distributed sweep must share: the digest of the prompt token ids (tokenizer, corpus,
    seed), the contract's key, the number of layers and the weights (content fingerprint, or hub id + commit)."""
    corpus, prompts, _ = contract_prompts(checkpoint, contract)
    ident = checkpoint.identity
    weights = ident.get("fingerprint") or [ident.get("id"), ident.get("revision"), ident.get("commit")]
    return {"prompts": prompts_digest(prompts.ids.tolist()), "contract": contract.key(corpus.sha256),
            "num_layers": checkpoint.num_layers, "weights": weights}


def cache_pairs(checkpoint: Checkpoint, contract: Contract, vectors: dict) -> list[str]:
    """Store pair vectors ``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` computed elsewhere (by another rank) in
    ``checkpoint``'s cache entry for ``contract``, in one durable write, skipping pairs already there; returns the
    entry's problems (an unwritable cache is one, not an error)."""
    _, prompts, entry = contract_prompts(checkpoint, contract)
    digest = prompts_digest(prompts.ids.tolist())
    have = entry.read_pairs(contract.prompts, list(vectors), digest)
    entry.write_pairs({p: v for p, v in vectors.items() if p not in have}, digest)
    return entry.problems


def kl_impl_setting(engine_kw: dict | None) -> str:
    """The KL implementation asked for: ``engine_kw["kl_impl"]``, else ``$SWAPKL_KL``, else ``auto``."""
    impl = (engine_kw or {}).get("kl_impl") or os.environ.get("SWAPKL_KL") or "auto"
    if impl not in KL_IMPLS:
        raise ContractError(f"SWAPKL_KL={impl!r} is not a KL implementation; use one of {', '.join(KL_IMPLS)}")
    return impl


class _Sweep:
    """One :func:`score` call: the prompts and the cache entry (``__init__``: what is cached, what is left for this
    rank), the engine with its noise floor, the sweep writing each finished pair, and the result."""

    def __init__(self, checkpoint: Checkpoint, contract: Contract, progress, use_cache: bool, on_partial, pairs,
                 shard, metadata: bool = True):
        self.t_start = time.perf_counter()
        if contract.dtype != checkpoint.dtype:
            raise ContractError(f"the contract asks for {contract.dtype} but the model was loaded as {checkpoint.dtype}")
        self.checkpoint, self.contract, self.progress = checkpoint, contract, progress
        self.use_cache, self.on_partial, self.metadata = use_cache, on_partial, metadata
        self.L = checkpoint.num_layers
        if contract.unit != "block":  # a family without validated sublayers: one line, before any prompt is cut
            layout_for(checkpoint.model, locate(checkpoint.model))
        self.wanted = [tuple(p) for p in (pairs if pairs is not None else contract.pair_list(self.L))]
        # pairs the per-layer definition leaves undefined (slot: blocks of different structure) are never computed
        self.undefined = undefined_moves(BlockRunner(checkpoint.model, contract.unit, contract.per_layer), self.wanted)
        self.wanted = [p for p in self.wanted if p not in self.undefined]
        check_context(checkpoint.model, contract.tokens, f"--tokens {contract.tokens} (tokens per prompt)",
                      "use at most {limit}", name=checkpoint.identity.get("display"))
        self.corpus, self.prompts, self.entry = contract_prompts(checkpoint, contract)
        self.digest = prompts_digest(self.prompts.ids.tolist())
        self.done, meta = self._cached()
        self.todo = self._todo(shard)
        self.total = 3 * (len(self.done) + len(self.todo))
        self.base_done = 3 * len(self.done)
        self.progress_at = self.base_done
        self.info = {"swapkl_version": __version__, "device": str(checkpoint.device), "cached_pairs": len(self.done),
                     "computed_pairs": len(self.todo), "computed_pair_list": [list(p) for p in self.todo],
                     "noise_floor": meta.get("noise_floor") if meta else None,
                     "noise_floor_parts": meta.get("noise_floor_parts") if meta else None,
                     "cache_key": self.entry.key, "cache_problems": self.entry.problems}
        if progress is not None:
            progress(self.base_done, self.total, "cached pairs loaded")
        # a missing or corrupt meta.json beside cached pairs is rewritten (with its noise floor), or every later run
        # would show the noise floor as unknown
        self.rewrite_meta = metadata and use_cache and meta is None and bool(self.done)

    def _cached(self) -> tuple[dict, dict | None]:
        """The finished pairs in the cache made on these prompts, and the entry's meta when it describes these
        prompts (nothing without the cache).  The same key with other prompts (another tokenizer) deletes nothing:
        its pairs are filed under their prompts' digest, and the meta is rewritten with these prompts' noise floor.
        The one-file-per-pair files of earlier versions carry no digest: they belong to the prompts of the meta they
        were written with, which a rewritten meta remembers (``pair_files_prompts``)."""
        self.pair_files_prompts = None
        if not self.use_cache:
            return {}, None
        meta = self.entry.read_meta()
        if meta is not None:
            ids = meta.get("prompt_token_ids")
            self.pair_files_prompts = meta["pair_files_prompts"] if "pair_files_prompts" in meta else (
                prompts_digest(ids) if isinstance(ids, list) else None)
            if ids != self.prompts.ids.tolist():
                meta = None
        legacy = self.pair_files_prompts == self.digest
        return self.entry.read_pairs(self.contract.prompts, self.wanted, self.digest, legacy=legacy), meta

    def _todo(self, shard) -> list[tuple]:
        if shard is None:
            return [p for p in self.wanted if p not in self.done]
        # a fixed share of the wanted pairs (not of the missing ones), so that ranks reading the cache at
        # different moments still split the work disjointly and completely
        rank, world = shard
        if not (0 <= rank < world):
            raise ContractError(f"shard rank {rank} is not in 0..{world - 1}")
        mine = set(self.wanted[rank::world])
        return [p for p in self.wanted if p in mine and p not in self.done]

    def _on_oom(self, rec) -> None:
        # reported, not fatal: the engine halves the batch and retries the same rows
        msg = f"out of memory in {rec['where']}: batch {rec['from']} -> {rec['to']}, retrying"
        warnings.warn(msg, stacklevel=2)
        if self.progress is not None:
            self.progress(self.progress_at, self.total, msg)

    def engine(self, engine_kw: dict | None) -> SwapEngine:
        """The engine for this sweep, the noise floor measured on it (unless cached) and the entry's meta written."""
        ck, contract = self.checkpoint, self.contract
        limits = engine_limits(ck, contract.prompts, contract.tokens, contract.positions,
                               kl_bytes=8 if contract.kl_dtype == "float64" else 4) | (engine_kw or {})
        limits["kl_impl"] = kl_impl_setting(engine_kw)
        limits.setdefault("on_oom", self._on_oom)
        engine = SwapEngine(ck.model, self.prompts.ids, positions=contract.positions,
                            kl_dtype=getattr(torch, contract.kl_dtype), unit=contract.unit,
                            per_layer=contract.per_layer, **limits)
        if self.metadata and self.info["noise_floor"] is None:
            # the noise floor is the larger of two numerical effects: batching (batched baseline vs batch-of-one
            # forwards) and, below float32, precision (the same weights computed in float32)
            floors = {}
            for name, fn in (("batching", noise_floor), ("precision", precision_floor)):
                try:
                    floors[name] = fn(engine)
                except Exception as e:  # one prompt's forward may not fit; not essential
                    if not is_oom(e):
                        raise
            self.info["noise_floor_parts"] = floors
            self.info["noise_floor"] = max(floors.values()) if floors else None
        if self.use_cache and self.metadata:
            self.entry.write_meta({"prompt_token_ids": self.prompts.ids.tolist(), "prompts": self.prompts.description,
                                   "noise_floor": self.info["noise_floor"],
                                   "noise_floor_parts": self.info.get("noise_floor_parts"),
                                   "pair_files_prompts": self.pair_files_prompts, "contract": contract.to_dict()})
        return engine

    def run(self, engine: SwapEngine, should_stop) -> None:
        """Sweep the pairs left; each chunk of finished pairs is cached in one durable write and, with
        ``on_partial``, each finished pair is reported as a result."""
        def on_chunk(vectors):
            if self.use_cache:
                self.entry.write_pairs({p: {k: v.tolist() for k, v in vec.items()} for p, vec in vectors.items()},
                                       self.digest)

        def on_pair(i, j, vec):
            self.done[(i, j)] = {k: v.tolist() for k, v in vec.items()}
            if self.on_partial is not None:
                self.on_partial(self.result_of(dict(self.done), self.info))

        def prog(d, t, what):
            self.progress_at = self.base_done + d
            if self.progress is not None:
                self.progress(self.base_done + d, self.total, what)

        late = engine.undefined(self.todo)  # read off the baseline: a block that needs a handed-on state in slot 0
        if late:
            self.undefined.update(late)
            self.todo = [p for p in self.todo if p not in late]
            self.wanted = [p for p in self.wanted if p not in late]
            self.total -= 3 * len(late)
        engine.sweep(self.todo, progress=prog, on_pair=on_pair, should_stop=should_stop, on_chunk=on_chunk)
        st = engine.stats
        self.info["engine"] = {"block_calls": st.block_calls, "naive_block_calls": st.naive_block_calls,
                               "oom_retries": list(st.oom_retries), "max_rows": engine.batch.max_rows,
                               "max_live": engine.max_live, "kl_chunk_rows": engine.head.batch.max_rows,
                               "kl": dict(engine.head.kl.record), "seconds": st.seconds, "dtype": self.checkpoint.dtype,
                               "devices": [str(d) for d in _model_devices(self.checkpoint.model)]}

    def result_of(self, vectors: dict, extra_meta: dict) -> SwapResult:
        contract, corpus = self.contract, self.corpus
        return SwapResult.from_pair_vectors(
            self.L, vectors,
            contract=contract.to_dict() | {"corpus_label": corpus.label, "corpus_sha256": corpus.sha256},
            identity=self.checkpoint.identity, prompt_token_ids=self.prompts.ids.tolist(),
            prompts_info=self.prompts.description, noise_floor=extra_meta.get("noise_floor"), meta=extra_meta,
            undefined=dict(self.undefined))

    def result(self) -> SwapResult:
        self.info["seconds"] = time.perf_counter() - self.t_start
        return self.result_of({p: self.done[p] for p in self.wanted if p in self.done}, self.info)
