"""The library's front door: score a checkpoint under a contract, through the cache.

>>> ck = load_checkpoint("../shared/models/stories260K")
>>> res = score(ck, Contract(pairs="all", prompts=8, tokens=32))
>>> res.replacement()   # L x L, nats
"""
from __future__ import annotations

import time
import warnings
from typing import Callable

import torch

from swapkl import __version__
from swapkl.scoring.entries import ScoreEntry
from swapkl.model.checkpoints import Checkpoint, load_checkpoint  # noqa: F401  (re-exported)
from swapkl.contract import Contract
from swapkl.scoring.corpora import load_corpus
from swapkl.scoring.engine import noise_floor, precision_floor, ProgressFn, SwapEngine
from swapkl.errors import ContractError, is_oom
from swapkl.scoring.prompts import make_prompts
from swapkl.scoring.results import SwapResult
from swapkl.model.architectures import check_context, locate


def _model_devices(model: torch.nn.Module) -> list[torch.device]:
    return sorted({p.device for p in model.parameters()}, key=str)


def engine_limits(checkpoint, num_prompts: int, num_tokens: int, positions: str = "all") -> dict:
    """Engine sizes from the free device memory (CUDA: the least free of the devices holding the model) or
    a 4 GiB CPU budget.  ``checkpoint`` is a :class:`Checkpoint` or a bare model.

    Memory model (bytes; P prompts, T tokens, D hidden, L layers, V vocabulary, e element size):
    baseline states ``(L + 1) * P * T * D * e`` are fixed; of the rest, half goes to live variant row sets
    (each ``P * T * D * e``, three times over: the previous slot's output, a block call's concatenated input
    and its output), 30 % to one block call's activations
    (``rows * T * (4 D + 2 I + 2 H T) * 4``), 20 % to the KL (``rows * Ts * V * 4`` a few times over) and
    the cached baseline log-probs.  Returns ``max_rows``, ``max_live``, ``kl_chunk_rows``, ``logp_budget``."""
    model = checkpoint if isinstance(checkpoint, torch.nn.Module) else checkpoint.model
    cfg = model.config
    D = int(getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 1024))
    H = int(getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", 16))
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * D)
    V = int(getattr(cfg, "vocab_size", 50000))

    L = locate(model).num_layers
    elt = next(model.parameters()).element_size()
    cuda = [d for d in _model_devices(model) if d.type == "cuda"]
    if cuda:
        free = min(torch.cuda.mem_get_info(d)[0] for d in cuda)
        avail = int(free * 0.85)
    else:
        avail = 4 * 2**30  # 4 GiB of activations on the CPU
    P, T = num_prompts, num_tokens
    Ts = T if positions == "all" else 1
    states = (L + 1) * P * T * D * elt
    rest = max(avail - states, avail // 10)
    per_row = T * (4 * D + 2 * inter + 2 * H * T) * max(elt, 4)
    max_rows = max(1, min(4096, int(rest * 0.3) // max(1, per_row)))
    per_live = 3 * P * T * D * elt
    max_live = max(3, min(3 * 256, int(rest * 0.5) // max(1, per_live)))
    kl_budget = int(rest * 0.1) if cuda else 256 * 2**20
    kl_chunk_rows = max(1, min(P, kl_budget // max(1, 12 * Ts * V)))
    logp_budget = int(rest * 0.1) if cuda else 512 * 2**20
    return {"max_rows": int(max_rows), "max_live": int(max_live), "kl_chunk_rows": int(kl_chunk_rows),
            "logp_budget": int(logp_budget)}


def score(checkpoint: Checkpoint, contract: Contract, progress: ProgressFn | None = None,
          should_stop: Callable[[], bool] | None = None, use_cache: bool = True,
          on_partial: Callable[[SwapResult], None] | None = None, pairs=None, shard: tuple[int, int] | None = None,
          engine_kw: dict | None = None) -> SwapResult:
    """Both protocols on ``contract``'s pair set (or ``pairs``), reusing every cached pair.

    ``progress(done, total, what)`` counts variants (3 per pair; cached pairs count as done at once);
    ``on_partial(result)`` receives the result so far after each finished pair (adjacent pairs first);
    ``shard=(rank, world)`` computes only every world-th missing pair (a distributed run's share);
    ``should_stop()`` stops the sweep (raises :class:`ComputeInterrupted`; finished pairs stay cached).
    Raises :class:`ContractError` before any work when ``contract.tokens`` exceeds the model's context."""
    sweep = _Sweep(checkpoint, contract, progress, use_cache, on_partial, pairs, shard)
    if sweep.todo or sweep.rewrite_meta:
        engine = sweep.engine(engine_kw)
        if sweep.todo:
            sweep.run(engine, should_stop)
    return sweep.result()


class _Sweep:
    """One :func:`score` call: the prompts and the cache entry (``__init__``: what is cached, what is left for this
    rank), the engine with its noise floor, the sweep writing each finished pair, and the result."""

    def __init__(self, checkpoint: Checkpoint, contract: Contract, progress, use_cache: bool, on_partial, pairs,
                 shard):
        self.t_start = time.perf_counter()
        if contract.dtype != checkpoint.dtype:
            raise ContractError(f"the contract asks for {contract.dtype} but the model was loaded as {checkpoint.dtype}")
        self.checkpoint, self.contract, self.progress = checkpoint, contract, progress
        self.use_cache, self.on_partial = use_cache, on_partial
        self.L = checkpoint.num_layers
        self.wanted = [tuple(p) for p in (pairs if pairs is not None else contract.pair_list(self.L))]
        check_context(checkpoint.model, contract.tokens, f"--tokens {contract.tokens} (tokens per prompt)",
                      "use at most {limit}", name=checkpoint.identity.get("display"))
        self.corpus = load_corpus(contract.corpus)
        self.prompts = make_prompts(checkpoint.tokenizer, self.corpus, contract.prompts, contract.tokens, contract.seed,
                                    contract.bos)
        self.entry = ScoreEntry(checkpoint.identity, contract.key(self.corpus.sha256))
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
        self.rewrite_meta = use_cache and meta is None and bool(self.done)

    def _cached(self) -> tuple[dict, dict | None]:
        """The finished pairs in the cache and the entry's meta (nothing without the cache)."""
        if not self.use_cache:
            return {}, None
        meta = self.entry.read_meta()
        if meta is not None and meta.get("prompt_token_ids") != self.prompts.ids.tolist():
            self.entry.clear()  # same key, different prompts: tokenizer changed; start over
            meta = None
        return self.entry.read_pairs(self.contract.prompts, self.wanted), meta

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
        limits = engine_limits(ck, contract.prompts, contract.tokens, contract.positions) | (engine_kw or {})
        limits.setdefault("on_oom", self._on_oom)
        engine = SwapEngine(ck.model, self.prompts.ids, positions=contract.positions,
                            kl_dtype=getattr(torch, contract.kl_dtype), **limits)
        if self.info["noise_floor"] is None:
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
        if self.use_cache:
            self.entry.write_meta({"prompt_token_ids": self.prompts.ids.tolist(), "prompts": self.prompts.description,
                                   "noise_floor": self.info["noise_floor"],
                                   "noise_floor_parts": self.info.get("noise_floor_parts"),
                                   "contract": contract.to_dict()})
        return engine

    def run(self, engine: SwapEngine, should_stop) -> None:
        """Sweep the pairs left; each finished pair is cached and, with ``on_partial``, reported as a result."""
        def on_pair(i, j, vec):
            vec = {k: v.tolist() for k, v in vec.items()}
            self.done[(i, j)] = vec
            if self.use_cache:
                self.entry.write_pair(i, j, vec)
            if self.on_partial is not None:
                self.on_partial(self.result_of(dict(self.done), self.info))

        def prog(d, t, what):
            self.progress_at = self.base_done + d
            if self.progress is not None:
                self.progress(self.base_done + d, self.total, what)

        engine.sweep(self.todo, progress=prog, on_pair=on_pair, should_stop=should_stop)
        self.info["engine"] = {"block_calls": engine.stats.block_calls,
                               "naive_block_calls": engine.stats.naive_block_calls,
                               "oom_retries": list(engine.stats.oom_retries), "max_rows": engine.batch.max_rows,
                               "max_live": engine.max_live, "kl_chunk_rows": engine.kl_chunk_rows,
                               "seconds": engine.stats.seconds, "dtype": self.checkpoint.dtype,
                               "devices": [str(d) for d in _model_devices(self.checkpoint.model)]}

    def result_of(self, vectors: dict, extra_meta: dict) -> SwapResult:
        contract, corpus = self.contract, self.corpus
        return SwapResult.from_pair_vectors(
            self.L, vectors,
            contract=contract.to_dict() | {"corpus_label": corpus.label, "corpus_sha256": corpus.sha256},
            identity=self.checkpoint.identity, prompt_token_ids=self.prompts.ids.tolist(),
            prompts_info=self.prompts.description, noise_floor=extra_meta.get("noise_floor"), meta=extra_meta)

    def result(self) -> SwapResult:
        self.info["seconds"] = time.perf_counter() - self.t_start
        return self.result_of({p: self.done[p] for p in self.wanted if p in self.done}, self.info)
