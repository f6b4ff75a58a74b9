"""Split one swap-KL sweep over several processes (GPUs or machines) with ``torch.distributed``.

Run it with ``torchrun`` (one process per rank; ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous
variables come from torchrun)::

    torchrun --nproc_per_node=8 -m swapkl.commands.distributed EleutherAI/pythia-410m --pairs all \\
        --prompts 100 --tokens 128 --dtype bfloat16 --json pythia-410m.json

What each rank does:

1. load the model - on ``cuda:LOCAL_RANK`` when CUDA is available (or on its own group of
   ``--gpus-per-rank`` GPUs with ``--device-map auto``), else on the CPU;
2. cut the prompts and tell every rank what it will compute on (:func:`~swapkl.scoring.score.prompts_fingerprint`:
   the prompt token ids' digest, the contract, the layers, the weights); a rank that disagrees with rank 0 (another
   tokenizer, corpus or checkpoint) stops every rank with one line naming it, before any rank touches a cache;
3. compute its fixed share of the pair set - every ``world``-th pair of the contract's ordered pair list, starting
   at ``rank`` - through its own cache (``$SWAPKL_CACHE`` of that rank's machine; nothing needs to be shared), so a
   rerun resumes; only rank 0 measures the noise floor and writes the entry's ``meta.json``;
4. report (ok / error, the pairs it computed, seconds) to every rank, then send its pairs' per-prompt vectors to
   rank 0 over the process group (``gather_object``);
5. rank 0 checks that every rank sent its whole share (a missing pair is an error naming the pair and the rank:
   rank 0 never computes it in its place), assembles the result, stores the other ranks' pairs in its own cache
   and writes ``--json``.

Nothing is numerically different from a one-process run: each pair is computed by the same engine from the
same prompts; only the batching of variants differs (equal to float32 rounding, ~1e-7 nats).

The backend is ``gloo`` by default (it carries a few small Python objects and the per-prompt vectors, a few MB at
most; the models never communicate), which works for CPU and GPU ranks alike and across machines.
"""
from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass

from swapkl.errors import SwapklError

# Deferred imports: torch (and torch.distributed) and the torch-based swapkl modules are imported inside the
# functions that use them: the CLI's --help registers this command without loading them.


class DistributedError(SwapklError):
    """A rank failed, or the distributed environment is not usable."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world: int
    local_rank: int
    local_world: int


def rank_info(env: dict | None = None) -> RankInfo:
    """Rank, world size and local rank from torchrun's environment (a single process when absent)."""
    env = os.environ if env is None else env
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError as e:
        raise DistributedError(f"bad torchrun environment: {e}") from e
    if not (0 <= rank < world):
        raise DistributedError(f"RANK={rank} is not in 0..{world - 1}")
    return RankInfo(rank, world, local_rank, local_world)


def restrict_gpus(info: RankInfo, gpus_per_rank: int, env: dict | None = None) -> list[str] | None:
    """Give this rank its own ``gpus_per_rank`` GPUs (for ``--device-map auto`` inside a rank) by setting
    ``CUDA_VISIBLE_DEVICES`` before CUDA is first used.  Returns the visible list, or None when unchanged."""
    env = os.environ if env is None else env
    if gpus_per_rank <= 0:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    all_ids = [v for v in visible.split(",") if v.strip()] if visible else None
    start = info.local_rank * gpus_per_rank
    if all_ids is None:
        mine = [str(start + k) for k in range(gpus_per_rank)]
    else:
        mine = all_ids[start:start + gpus_per_rank]
        if len(mine) < gpus_per_rank:
            raise DistributedError(f"local rank {info.local_rank} needs GPUs {start}..{start + gpus_per_rank - 1} "
                                   f"but CUDA_VISIBLE_DEVICES has {len(all_ids)}")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    env["SWAPKL_GPU_GROUP"] = ",".join(mine)  # tells init_group that this rank's GPUs start at cuda:0
    return mine


def rank_device(info: RankInfo, device: str = "auto", device_map=None) -> str:
    """The device a rank loads its model on: ``cuda:LOCAL_RANK`` when CUDA is there (and no device_map
    spreads the model), else what was asked (``cpu`` stays ``cpu``)."""
    import torch

    if device_map is not None:
        return device
    if device in ("auto", "cuda") and torch.cuda.is_available():
        if os.environ.get("SWAPKL_GPU_GROUP"):  # --gpus-per-rank: this rank sees only its own GPUs
            return "cuda:0"
        n = torch.cuda.device_count()
        if info.local_rank >= n:
            raise DistributedError(f"local rank {info.local_rank} but only {n} CUDA device(s) on this machine; "
                                   f"use --nproc_per_node={n}")
        return f"cuda:{info.local_rank}"
    if device == "auto":
        return "cpu"
    return device


def init_group(info: RankInfo, backend: str, timeout_s: float):
    import torch.distributed as dist

    if info.world == 1 or (dist.is_available() and dist.is_initialized()):
        return False
    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise DistributedError("--backend nccl needs CUDA; use --backend gloo on CPUs")
        # nccl collectives run on the current device: the rank's own GPU (the first of its group)
        torch.cuda.set_device(0 if os.environ.get("SWAPKL_GPU_GROUP") else info.local_rank)
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return True


def gather_ranks(obj, info: RankInfo) -> list:
    """``obj`` of every rank, on every rank."""
    if info.world == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * info.world
    dist.all_gather_object(out, obj)
    return out


def gather_to_root(obj, info: RankInfo) -> list | None:
    """``obj`` of every rank on rank 0 (None elsewhere)."""
    if info.world == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * info.world if info.rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def fail_if_any(errors: list, what: str = "") -> None:
    bad = [(r, err) for r, err in enumerate(errors) if err]
    if bad:
        raise DistributedError(what + "; ".join(f"rank {r}: {err}" for r, err in bad))


def check_agreement(prints: list[dict]) -> None:
    """Every rank's :func:`~swapkl.scoring.score.prompts_fingerprint` must equal rank 0's; raises
    :class:`DistributedError` naming each rank that differs and in what."""
    words = {"prompts": "its prompt token ids differ (another tokenizer, corpus or seed)",
             "contract": "its contract differs", "num_layers": "its model has another number of layers",
             "weights": "its weights differ (another checkpoint or revision)"}
    bad = []
    for r, fp in enumerate(prints[1:], start=1):
        diff = [words[k] for k in words if fp.get(k) != prints[0].get(k)]
        if diff:
            bad.append(f"rank {r} disagrees with rank 0: {', '.join(diff)}")
    if bad:
        raise DistributedError("; ".join(bad) + "; every rank must load the same model, tokenizer and corpus "
                               "(no cache was read or changed)")


def share_of(pairs: list, rank: int, world: int) -> list:
    """Rank ``rank``'s fixed share of the ordered pair list: every ``world``-th pair from position ``rank``."""
    return list(pairs[rank::world])


def pair_vectors(result, pairs) -> dict:
    """``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` (lists of per-prompt KLs, nats) of ``pairs`` in ``result``."""
    rp, it = result.per_prompt["repl"], result.per_prompt["inter"]
    return {(i, j): {"repl_ij": [float(x) for x in rp[(i, j)]], "repl_ji": [float(x) for x in rp[(j, i)]],
                     "inter": [float(x) for x in it[(i, j)]]} for i, j in pairs if (i, j) in it}


def merge_shares(pairs: list, shares: list[dict]) -> dict:
    """The vectors of every pair in ``pairs`` from the ranks' ``shares`` (rank r sent its :func:`share_of`).
    A pair its rank did not send is a :class:`DistributedError` naming the pair and the rank; nothing is computed
    in its place."""
    world = len(shares)
    out = {}
    for r, got in enumerate(shares):
        mine = share_of(pairs, r, world)
        missing = [p for p in mine if p not in (got or {})]
        if missing:
            raise DistributedError(
                f"pair {tuple(missing[0])} of rank {r}'s share is missing from what rank {r} sent ({len(missing)} of "
                f"its {len(mine)} pairs missing); rank 0 does not compute them in its place: run again to resume")
        out.update({tuple(p): got[tuple(p)] for p in mine})
    return out


def _merged(part, vectors: dict, reports: list[dict], dist_meta: dict, num_layers: int):
    """Rank 0's result: every rank's vectors with rank 0's contract, prompts, identity and noise floor."""
    from swapkl.scoring.results import SwapResult

    computed = sorted({tuple(p) for r in reports for p in r["computed"]})
    meta = dict(part.meta) | {"computed_pairs": len(computed), "cached_pairs": len(vectors) - len(computed),
                              "computed_pair_list": [list(p) for p in computed], "distributed": dist_meta}
    return SwapResult.from_pair_vectors(num_layers, vectors, contract=part.contract, identity=part.identity,
                                        prompt_token_ids=part.prompt_token_ids, prompts_info=part.prompts_info,
                                        noise_floor=part.noise_floor, meta=meta)


def score_distributed(model: str, contract, *, revision: str | None = None, device: str = "auto",
                      device_map=None, trust_remote_code: bool = False, backend: str = "gloo",
                      timeout_s: float = 7 * 24 * 3600, json_out: str | None = None, progress=None,
                      engine_kw: dict | None = None, info: RankInfo | None = None, use_cache: bool = True):
    """Run this rank's share of ``contract`` on ``model`` and (rank 0) merge.  Returns the merged
    :class:`~swapkl.scoring.results.SwapResult` on rank 0 and this rank's partial result elsewhere; both carry
    ``meta["distributed"] = {"world", "rank", "backend", "ranks": [{"rank", "device", "computed": [[i, j], ...],
    "seconds", "error"}]}``.  Raises :class:`DistributedError` on every rank when any rank failed."""
    info = info or rank_info()
    started = init_group(info, backend, timeout_s)
    try:
        return _run_rank(model, contract, info, backend, dict(revision=revision, device=device, device_map=device_map,
                         trust_remote_code=trust_remote_code), json_out, progress, engine_kw, use_cache)
    finally:
        if started:
            import torch.distributed as dist

            # every rank leaves its last collective before any rank tears gloo down: a peer that closes its
            # sockets while another still finishes a collective aborts that process ("terminate called
            # without an active exception")
            try:
                dist.barrier()
            finally:
                dist.destroy_process_group()


def _run_rank(model, contract, info: RankInfo, backend, load_kw, json_out, progress, engine_kw, use_cache):
    from swapkl.model.checkpoints import load_checkpoint  # deferred: pulls torch
    from swapkl.scoring.score import cache_pairs, prompts_fingerprint, score

    t0 = time.perf_counter()
    report = {"rank": info.rank, "device": None, "computed": [], "seconds": 0.0, "error": None}
    fp, part, vectors = None, None, {}
    try:
        dev = rank_device(info, load_kw["device"], load_kw["device_map"])
        ck = load_checkpoint(model, dtype=contract.dtype, **(load_kw | {"device": dev}))
        report["device"] = str(ck.device)
        fp = prompts_fingerprint(ck, contract)
    except Exception as e:  # reported to every rank, re-raised below
        report["error"] = f"{type(e).__name__}: {e}"
    fail_if_any(gather_ranks(report["error"], info))
    check_agreement(gather_ranks(fp, info))  # before any rank reads or writes a cache
    wanted = [tuple(p) for p in contract.pair_list(ck.num_layers)]
    mine = share_of(wanted, info.rank, info.world)
    try:
        part = score(ck, contract, progress=progress if info.rank == 0 else None, pairs=mine, engine_kw=engine_kw,
                     use_cache=use_cache, metadata=info.rank == 0)
        report["computed"] = [list(p) for p in part.meta.get("computed_pair_list", [])]
        vectors = pair_vectors(part, mine)
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
    report["seconds"] = time.perf_counter() - t0
    reports = gather_ranks(report, info)
    fail_if_any([r["error"] for r in reports])
    shares = gather_to_root(vectors, info)  # the pairs travel over the process group, not a shared disk
    dist_meta = {"world": info.world, "rank": info.rank, "backend": backend if info.world > 1 else None,
                 "ranks": reports}
    merged, merge_error = part, None
    if info.rank == 0:
        try:
            allv = merge_shares(wanted, shares)
            merged = _merged(part, allv, reports, dist_meta, ck.num_layers)
            if use_cache:
                merged.meta["cache_problems"] = list(merged.meta.get("cache_problems") or []) + cache_pairs(
                    ck, contract, {p: v for p, v in allv.items() if p not in set(mine)})
            if json_out:
                merged.save(json_out)
        except Exception as e:  # told to every rank, re-raised below
            merge_error = f"{type(e).__name__}: {e}"
    # rank 0 has merged (and written the JSON) before anyone returns or tears the group down
    merge_error = gather_ranks(merge_error, info)[0]
    if merge_error:
        raise DistributedError(f"rank 0 could not merge: {merge_error}")
    if info.rank != 0:
        merged.meta["distributed"] = dist_meta
    return merged
