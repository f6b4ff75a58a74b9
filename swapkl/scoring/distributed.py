"""Split one swap-KL sweep over several processes (GPUs or machines) with ``torch.distributed``.

Run it with ``torchrun`` (one process per rank; ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous
variables come from torchrun)::

    SWAPKL_CACHE=/shared/fs/swapkl-cache \\
    torchrun --nproc_per_node=8 -m swapkl.commands.distributed EleutherAI/pythia-410m --pairs all \\
        --prompts 100 --tokens 128 --dtype bfloat16 --json pythia-410m.json

What each rank does:

1. load the model - on ``cuda:LOCAL_RANK`` when CUDA is available (or on its own group of
   ``--gpus-per-rank`` GPUs with ``--device-map auto``), else on the CPU;
2. wait for every rank (barrier), then compute its fixed share of the pair set - every ``world``-th pair
   of the contract's ordered pair list, starting at ``rank`` (``score(..., shard=(rank, world))``) - writing
   each finished pair atomically into the shared cache entry (``$SWAPKL_CACHE``, one file per pair);
3. report (ok / error, the pairs it computed, seconds) to every rank; this is also the barrier after which
   all pairs are on disk;
4. rank 0 assembles the merged result with a plain :func:`swapkl.scoring.score.score` call (which now finds every
   pair in the cache and computes nothing) and writes ``--json``.

Nothing is numerically different from a one-process run: each pair is computed by the same engine from the
same prompts; only the batching of variants differs (equal to float32 rounding, ~1e-7 nats).

The coordination backend is ``gloo`` by default (it only carries a barrier and a few small Python objects;
the models never communicate), which works for CPU and GPU ranks alike and across machines.
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
    env["SWAPKL_GPU_GROUP"] = ",".join(mine)  # tells _init that this rank's GPUs start at cuda:0
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


def _init(info: RankInfo, backend: str, timeout_s: float):
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


def _gather(obj, info: RankInfo) -> list:
    if info.world == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * info.world
    dist.all_gather_object(out, obj)
    return out


def score_distributed(model: str, contract, *, revision: str | None = None, device: str = "auto",
                      device_map=None, trust_remote_code: bool = False, backend: str = "gloo",
                      timeout_s: float = 7 * 24 * 3600, json_out: str | None = None, progress=None,
                      engine_kw: dict | None = None, info: RankInfo | None = None):
    """Run this rank's share of ``contract`` on ``model`` and (rank 0) merge.  Returns the merged
    :class:`~swapkl.scoring.results.SwapResult` on rank 0 and this rank's partial result elsewhere; both carry
    ``meta["distributed"] = {"world", "rank", "ranks": [{"rank", "device", "computed": [[i, j], ...],
    "seconds", "error"}]}``.  Raises :class:`DistributedError` on every rank when any rank failed."""
    from swapkl.scoring.score import score  # deferred: pulls torch; the CLI and the dashboard import this module without it
    from swapkl.model.checkpoints import load_checkpoint

    info = info or rank_info()
    started = _init(info, backend, timeout_s)
    try:
        t0 = time.perf_counter()
        report = {"rank": info.rank, "device": None, "computed": [], "seconds": 0.0, "error": None}
        part = None
        try:
            dev = rank_device(info, device, device_map)
            ck = load_checkpoint(model, revision=revision, dtype=contract.dtype, device=dev,
                                 trust_remote_code=trust_remote_code, device_map=device_map)
            report["device"] = str(ck.device)
        except Exception as e:  # reported to every rank, re-raised below
            report["error"] = f"{type(e).__name__}: {e}"
        # every rank has its model (or failed) before anyone reads the cache
        loaded = _gather(report["error"], info)
        if any(loaded):
            bad = [(r, err) for r, err in enumerate(loaded) if err]
            raise DistributedError("; ".join(f"rank {r}: {err}" for r, err in bad))
        try:
            part = score(ck, contract, progress=progress if info.rank == 0 else None,
                         shard=(info.rank, info.world) if info.world > 1 else None, engine_kw=engine_kw)
            report["computed"] = [list(p) for p in part.meta.get("computed_pair_list", [])]
        except Exception as e:
            report["error"] = f"{type(e).__name__}: {e}"
        report["seconds"] = time.perf_counter() - t0
        reports = _gather(report, info)  # also the barrier: every pair of every rank is on disk now
        bad = [r for r in reports if r["error"]]
        if bad:
            raise DistributedError("; ".join(f"rank {r['rank']}: {r['error']}" for r in bad))
        dist_meta = {"world": info.world, "rank": info.rank, "backend": backend if info.world > 1 else None,
                     "ranks": reports}
        merged, merge_error = part, None
        if info.rank == 0:
            try:
                merged = score(ck, contract)  # every pair is cached: nothing is computed
                have = {tuple(p) for p in merged.pairs}
                missing = [p for p in contract.pair_list(ck.num_layers) if p not in have]
                if missing:
                    raise DistributedError(
                        f"{len(missing)} pair(s) missing from the cache after all ranks finished (first: "
                        f"{missing[0]}); is SWAPKL_CACHE on a filesystem every rank shares?")
                merged.meta["distributed"] = dist_meta
                if json_out:
                    merged.save(json_out)
            except Exception as e:  # told to every rank, re-raised below
                merge_error = f"{type(e).__name__}: {e}"
        # rank 0 has merged (and written the JSON) before anyone returns or tears the group down
        merge_error = _gather(merge_error, info)[0]
        if merge_error:
            raise DistributedError(f"rank 0 could not merge: {merge_error}")
        if info.rank != 0:
            merged.meta["distributed"] = dist_meta
        return merged
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
