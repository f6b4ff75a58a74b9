"""``score-distributed``: the ``score`` command split over the ranks of a ``torchrun`` job.

    torchrun --nproc_per_node=N -m swapkl.commands.distributed MODEL [score args] --json OUT
    torchrun --nproc_per_node=N -m swapkl score-distributed MODEL [score args] --json OUT

(``... -m swapkl.commands.distributed bridge MODEL [bridge args]``: the bridged matrix, ``bridge-distributed``.)

Each rank computes its share of the pairs (through its own ``$SWAPKL_CACHE``, so a rerun resumes) and sends the
vectors to rank 0 over the process group; rank 0 merges them and writes ``--json``.  No shared filesystem is
needed.  Without torchrun (no ``WORLD_SIZE``) it is an ordinary one-process ``score``.  The rank logic lives in
:mod:`swapkl.scoring.distributed`; this module holds the parser, the command and the ``-m`` entry point.
"""
from __future__ import annotations

import argparse
import os
import sys

from swapkl.commands.common import ProgressPrinter, add_contract_args, add_model_args, add_rank_args, \
    check_outputs, contract_from_args
from swapkl.commands.score import render_summary
from swapkl.errors import SwapklError
from swapkl.scoring.distributed import rank_info, restrict_gpus, score_distributed



def register(sub) -> None:
    p = sub.add_parser("score-distributed", help="score split over torchrun ranks (one shard of pairs per rank)")
    add_cli_args(p)
    p.set_defaults(func=run)


def add_cli_args(p) -> None:
    add_model_args(p)
    add_contract_args(p)
    add_rank_args(p)


def run(a) -> int:
    """The command: parsed ``a`` -> this rank's share, merged and summarised on rank 0."""
    contract = contract_from_args(a)  # validates before any loading
    check_outputs(a, {"--json": a.json})
    info = rank_info()
    if a.gpus_per_rank:
        restrict_gpus(info, a.gpus_per_rank)  # before CUDA is first touched
    res = score_distributed(a.model, contract, revision=a.revision, device=a.device, device_map=a.device_map,
                            trust_remote_code=a.trust_remote_code, backend=a.backend,
                            timeout_s=a.timeout_hours * 3600, json_out=a.json,
                            progress=ProgressPrinter(a.quiet), info=info, use_cache=not a.no_cache)
    d = res.meta["distributed"]
    if info.rank == 0 and not a.quiet:
        print(render_summary(res))
        for r in d["ranks"]:
            print(f"rank {r['rank']} on {r['device']}: {len(r['computed'])} pairs computed in {r['seconds']:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc_per_node=N -m swapkl.commands.distributed MODEL [score args]`` (the same as the
    ``score-distributed`` command) or ``... -m swapkl.commands.distributed bridge MODEL [bridge args]`` (the same as
    ``bridge-distributed``; a model folder named ``bridge`` is ``./bridge``), with the CLI's error handling: a user
    error prints one line and exits 2."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    argv = sys.argv[1:] if argv is None else list(argv)
    prog = "torchrun --nproc_per_node=N -m swapkl.commands.distributed"
    if argv[:1] == ["bridge"]:
        from swapkl.commands import bridge_distributed as cmd

        p = argparse.ArgumentParser(prog=prog + " bridge", description="bridged swap-KL split over torchrun ranks")
        argv = argv[1:]
    else:
        cmd = sys.modules[__name__]
        p = argparse.ArgumentParser(prog=prog, description="swap-KL scoring split over torchrun ranks")
    cmd.add_cli_args(p)
    a = p.parse_args(argv)
    try:
        return int(cmd.run(a) or 0)
    except SwapklError as e:
        rank = os.environ.get("RANK", "0")
        print(f"error (rank {rank}): {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished pairs are kept in the cache", file=sys.stderr)
        return 130



if __name__ == "__main__":
    raise SystemExit(main())
