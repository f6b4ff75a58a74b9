"""The library's front door: score a checkpoint under a contract, through the cache.

>>> ck = load_checkpoint("../shared/models/stories260K")
>>> res = score(ck, Contract(pairs="all", prompts=8, tokens=32))
>>> res.replacement()   # L x L, nats
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from swapkl import __version__
from swapkl.cache import ScoreEntry
from swapkl.checkpoints import Checkpoint, load_checkpoint  # noqa: F401  (re-exported)
from swapkl.contract import Contract
from swapkl.corpora import load_corpus
from swapkl.engine import ProgressFn, SwapEngine
from swapkl.errors import ContractError
from swapkl.prompts import make_prompts
from swapkl.results import SwapResult


def engine_limits(checkpoint: Checkpoint, num_prompts: int, num_tokens: int) -> dict:
    """Batch and live-set sizes for the engine from the device's free memory (CUDA) or a CPU budget.

    ``max_rows``: prompt rows per block call (activations ~ rows * T * (D * 12 + heads * T) floats);
    ``max_live``: variant row sets alive at once (each P * T * D values)."""
    model = checkpoint.model
    cfg = model.config
    D = int(getattr(cfg, "hidden_size", getattr(cfg, "n_embd", 1024)))
    H = int(getattr(cfg, "num_attention_heads", getattr(cfg, "n_head", 16)))
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * D)
    elt = next(model.parameters()).element_size()
    dev = next(model.parameters()).device
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        budget = int(free * 0.6)
    else:
        budget = 2 * 2**30  # 2 GiB of activations on the CPU
    per_row = num_tokens * (4 * D + 2 * inter + 2 * H * num_tokens) * max(elt, 4)
    max_rows = max(1, min(4096, budget // 2 // max(1, per_row)))
    per_live = num_prompts * num_tokens * D * elt
    max_live = max(3, min(3 * 256, budget // 2 // max(1, per_live)))
    return {"max_rows": int(max_rows), "max_live": int(max_live)}


def score(checkpoint: Checkpoint, contract: Contract, progress: ProgressFn | None = None,
          should_stop: Callable[[], bool] | None = None, use_cache: bool = True,
          on_partial: Callable[[SwapResult], None] | None = None, pairs=None, shard: tuple[int, int] | None = None,
          engine_kw: dict | None = None) -> SwapResult:
    """Both protocols on ``contract``'s pair set (or ``pairs``), reusing every cached pair.

    ``progress(done, total, what)`` counts variants (3 per pair; cached pairs count as done at once);
    ``on_partial(result)`` receives the result so far after each finished pair (adjacent pairs first);
    ``shard=(rank, world)`` computes only every world-th missing pair (a distributed run's share);
    ``should_stop()`` stops the sweep (raises :class:`ComputeInterrupted`; finished pairs stay cached)."""
    t_start = time.perf_counter()
    if contract.dtype != checkpoint.dtype:
        raise ContractError(f"the contract asks for {contract.dtype} but the model was loaded as {checkpoint.dtype}")
    L = checkpoint.num_layers
    wanted = [tuple(p) for p in (pairs if pairs is not None else contract.pair_list(L))]
    corpus = load_corpus(contract.corpus)
    prompts = make_prompts(checkpoint.tokenizer, corpus, contract.prompts, contract.tokens, contract.seed,
                           contract.bos)
    entry = ScoreEntry(checkpoint.identity, contract.key(corpus.sha256))
    done: dict = {}
    meta = entry.read_meta() if use_cache else None
    if use_cache:
        if meta is not None and meta.get("prompt_token_ids") != prompts.ids.tolist():
            entry.clear()  # same key, different prompts: tokenizer changed; start over
            meta = None
        done = entry.read_pairs(contract.prompts, wanted)
    todo = [p for p in wanted if p not in done]
    if shard is not None:
        rank, world = shard
        todo = todo[rank::world]
    total = 3 * (len(done) + len(todo))
    base_done = 3 * len(done)

    def result_of(vectors: dict, extra_meta: dict) -> SwapResult:
        return SwapResult.from_pair_vectors(
            L, vectors, contract=contract.to_dict() | {"corpus_label": corpus.label, "corpus_sha256": corpus.sha256},
            identity=checkpoint.identity, prompt_token_ids=prompts.ids.tolist(), prompts_info=prompts.description,
            noise_floor=extra_meta.get("noise_floor"), meta=extra_meta)

    info = {"swapkl_version": __version__, "device": str(checkpoint.device), "cached_pairs": len(done),
            "computed_pairs": len(todo), "noise_floor": meta.get("noise_floor") if meta else None,
            "cache_key": entry.key, "cache_problems": entry.problems}
    if progress is not None:
        progress(base_done, total, "cached pairs loaded")
    if todo:
        limits = engine_limits(checkpoint, contract.prompts, contract.tokens) | (engine_kw or {})
        engine = SwapEngine(checkpoint.model, prompts.ids, positions=contract.positions, **limits)
        if info["noise_floor"] is None:
            info["noise_floor"] = engine.noise_floor()
        if use_cache:
            entry.write_meta({"prompt_token_ids": prompts.ids.tolist(), "prompts": prompts.description,
                              "noise_floor": info["noise_floor"], "contract": contract.to_dict()})

        def on_pair(i, j, vec):
            vec = {k: v.tolist() for k, v in vec.items()}
            done[(i, j)] = vec
            if use_cache:
                entry.write_pair(i, j, vec)
            if on_partial is not None:
                on_partial(result_of(dict(done), info))

        def prog(d, t, what):
            if progress is not None:
                progress(base_done + d, total, what)

        engine.sweep(todo, progress=prog, on_pair=on_pair, should_stop=should_stop)
        info["engine"] = {"block_calls": engine.stats.block_calls, "naive_block_calls": engine.stats.naive_block_calls,
                          "oom_retries": engine.stats.oom_retries, "max_rows": engine.batch.max_rows}
    info["seconds"] = time.perf_counter() - t_start
    have = {p: done[p] for p in wanted if p in done}
    return result_of(have, info)
