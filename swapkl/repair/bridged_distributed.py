"""The third matrix (bridged swap-KL) split over the ranks of a ``torchrun`` job::

    torchrun --nproc_per_node=N -m swapkl.commands.distributed bridge MODEL [bridge args] --json OUT

The same protocol as the swap-KL sweep (:mod:`swapkl.scoring.distributed`): every rank loads the model, cuts the
prompts and tells every rank what it will compute on; a rank that disagrees with rank 0 (another tokenizer, corpus
or checkpoint) stops every rank with one line naming it before any rank reads or writes a cache.  Each rank then
computes its fixed share of the spans - every ``world``-th span of :func:`~swapkl.repair.bridged_kl.bridge_spans`
from position ``rank``, calibration and fits included (:func:`~swapkl.repair.bridged_kl.bridged_scores` with
``shard=(rank, world)``) - through its own ``$SWAPKL_CACHE`` (shared or not), so a rerun resumes; the per-prompt
vectors and fit summaries travel to rank 0 over the process group; rank 0 checks that every rank sent its whole
share, stores the other ranks' spans in its own cache and writes the same ``swapkl.bridged/1`` JSON as one process.

Every span is computed by the same code from the same calibration text and prompts as in one process; only which
spans share a batched call differs (equal to float32 rounding).
"""
from __future__ import annotations

import time

from swapkl.scoring.distributed import (DistributedError, RankInfo, fail_if_any, gather_ranks, gather_to_root, init_group,
                                        check_agreement, merge_shares, rank_device, rank_info)

# Deferred imports: torch and the torch-based swapkl modules are imported inside the functions that use them.


def bridged_distributed(model: str, contract, settings=None, *, load_kw: dict | None = None, backend: str = "gloo",
                        timeout_s: float = 7 * 24 * 3600, json_out: str | None = None, progress=None,
                        info: RankInfo | None = None, use_cache: bool = True):
    """Run this rank's share of the bridged spans of ``contract`` on ``model`` and (rank 0) merge.  ``load_kw``:
    :func:`~swapkl.model.checkpoints.load_checkpoint`'s ``revision``, ``device``, ``device_map``,
    ``trust_remote_code``.  Returns the merged :class:`~swapkl.repair.bridged_kl.BridgedResult` on rank 0 and this
    rank's share elsewhere; both carry ``meta["distributed"] = {"world", "rank", "backend", "ranks": [{"rank",
    "device", "spans", "computed_spans", "seconds", "error"}]}``.  Raises :class:`DistributedError` on every rank
    when any rank failed."""
    from swapkl.repair.bridged_kl import BridgeSettings

    info = info or rank_info()
    load_kw = {"revision": None, "device": "auto", "device_map": None, "trust_remote_code": False} | (load_kw or {})
    started = init_group(info, backend, timeout_s)
    try:
        return _run_rank(model, contract, settings or BridgeSettings(), info, backend, load_kw, json_out, progress,
                         use_cache)
    finally:
        if started:
            import torch.distributed as dist

            try:  # every rank leaves its last collective before any rank tears gloo down
                dist.barrier()
            finally:
                dist.destroy_process_group()


def _run_rank(model, contract, settings, info: RankInfo, backend, load_kw, json_out, progress, use_cache):
    from swapkl.model.checkpoints import load_checkpoint  # deferred: pulls torch
    from swapkl.repair.bridged_kl import bridge_spans, bridged_scores
    from swapkl.scoring.score import prompts_fingerprint

    t0 = time.perf_counter()
    report = {"rank": info.rank, "device": None, "spans": [], "computed_spans": 0, "seconds": 0.0, "error": None}
    fp, part = None, None
    try:
        dev = rank_device(info, load_kw["device"], load_kw["device_map"])
        ck = load_checkpoint(model, dtype=contract.dtype, **(load_kw | {"device": dev}))
        report["device"] = str(ck.device)
        fp = prompts_fingerprint(ck, contract)
    except Exception as e:  # reported to every rank, raised below
        report["error"] = f"{type(e).__name__}: {e}"
    fail_if_any(gather_ranks(report["error"], info))
    check_agreement(gather_ranks(fp, info))  # before any rank reads or writes a cache
    wanted = bridge_spans(contract, ck.num_layers)
    try:
        part = bridged_scores(ck, contract, settings, progress=progress if info.rank == 0 else None,
                              use_cache=use_cache, shard=(info.rank, info.world))
        report["spans"] = [list(s) for s in sorted(part.spans)]
        report["computed_spans"] = int(part.meta["computed_spans"])
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
    report["seconds"] = time.perf_counter() - t0
    reports = gather_ranks(report, info)
    fail_if_any([r["error"] for r in reports])
    shares = gather_to_root((part.spans, part.calibration, part.meta["fit_seconds"]), info)
    dist_meta = {"world": info.world, "rank": info.rank, "backend": backend if info.world > 1 else None,
                 "ranks": reports}
    merged, merge_error = part, None
    if info.rank == 0:
        try:
            merged = _merged(part, wanted, shares, dist_meta, t0)
            if use_cache:
                _cache_others(ck, contract, settings, merged.spans, set(part.spans))
            if json_out:
                merged.to_json(json_out)
        except Exception as e:  # told to every rank, raised below
            merge_error = f"{type(e).__name__}: {e}"
    merge_error = gather_ranks(merge_error, info)[0]  # rank 0 has merged and written before anyone returns
    if merge_error:
        raise DistributedError(f"rank 0 could not merge: {merge_error}")
    if info.rank != 0:
        merged.meta["distributed"] = dist_meta
    return merged


def _merged(part, wanted: list, shares: list, dist_meta: dict, t0: float):
    """Rank 0's result: every rank's spans (each rank's whole share, else an error naming the span and the rank)
    with rank 0's contract, settings and identity; the calibration described by the first rank that calibrated."""
    from swapkl.repair.bridged_kl import BridgedResult

    spans = merge_shares(wanted, [s[0] for s in shares])
    calibration = next((s[1] for s in shares if s[1]), {})
    computed = sum(r["computed_spans"] for r in dist_meta["ranks"])
    meta = dict(part.meta) | {"computed_spans": computed, "cached_spans": len(spans) - computed,
                              "fit_seconds": sum(s[2] for s in shares), "seconds": time.perf_counter() - t0,
                              "distributed": dist_meta}
    return BridgedResult(part.num_layers, spans, part.contract, part.settings, part.identity, calibration, meta)


def _cache_others(checkpoint, contract, settings, spans: dict, mine: set) -> None:
    """Store the other ranks' spans in this rank's cache (a later one-process run on this machine reuses them)."""
    from swapkl.repair.bridged_kl import cache_spans

    others = {s: v for s, v in spans.items() if s not in mine}
    if others:
        cache_spans(checkpoint, contract, settings, others)
