"""``bridge-distributed``: the ``bridge`` command (the third matrix) split over the ranks of a ``torchrun`` job.

    torchrun --nproc_per_node=N -m swapkl.commands.distributed bridge MODEL [bridge args] --json OUT
    torchrun --nproc_per_node=N -m swapkl bridge-distributed MODEL [bridge args] --json OUT

Each rank computes its share of the spans, fits included (through its own ``$SWAPKL_CACHE``, so a rerun resumes),
and sends them to rank 0 over the process group; rank 0 merges and writes ``--json``, the same ``swapkl.bridged/1``
file as ``bridge``.  Without torchrun (no ``WORLD_SIZE``) it is an ordinary one-process ``bridge``.  The rank logic
lives in :mod:`swapkl.repair.bridged_distributed`.
"""
from __future__ import annotations

from swapkl.commands.bridge import add_bridge_args, render
from swapkl.commands.common import ProgressPrinter, add_contract_args, add_model_args, add_rank_args, bridge_settings_of, \
    block_unit_only, check_outputs, contract_from_args
from swapkl.scoring.distributed import rank_info, restrict_gpus


def register(sub) -> None:
    p = sub.add_parser("bridge-distributed", help="bridge split over torchrun ranks (one shard of spans per rank)")
    add_cli_args(p)
    p.set_defaults(func=run)


def add_cli_args(p) -> None:
    add_model_args(p)
    add_contract_args(p)
    add_bridge_args(p)
    add_rank_args(p)


def run(a) -> int:
    """The command: parsed ``a`` -> this rank's share of spans, merged and summarised on rank 0."""
    from swapkl.repair.bridged_distributed import bridged_distributed

    contract = contract_from_args(a)  # validates before any loading
    block_unit_only(a, "bridge")
    settings = bridge_settings_of(a)
    check_outputs(a, {"--json": a.json})
    info = rank_info()
    if a.gpus_per_rank:
        restrict_gpus(info, a.gpus_per_rank)  # before CUDA is first touched
    load_kw = {"revision": a.revision, "device": a.device, "device_map": a.device_map,
               "trust_remote_code": a.trust_remote_code}
    res = bridged_distributed(a.model, contract, settings, load_kw=load_kw, backend=a.backend,
                              timeout_s=a.timeout_hours * 3600, json_out=a.json, progress=ProgressPrinter(a.quiet),
                              info=info, use_cache=not a.no_cache)
    if info.rank == 0 and not a.quiet:
        print(render(res))
        for r in res.meta["distributed"]["ranks"]:
            print(f"rank {r['rank']} on {r['device']}: {r['computed_spans']} of its {len(r['spans'])} spans computed "
                  f"in {r['seconds']:.1f}s")
    return 0
