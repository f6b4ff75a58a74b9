"""``score-distributed``: the ``score`` command split over the ranks of a ``torchrun`` job.

    torchrun --nproc_per_node=N -m swapkl.distributed MODEL [score args] --json OUT
    torchrun --nproc_per_node=N -m swapkl score-distributed MODEL [score args] --json OUT   (once registered)

Each rank computes its share of the pairs into the shared cache (``$SWAPKL_CACHE``); rank 0 merges them and
writes ``--json``.  Without torchrun (no ``WORLD_SIZE``) it is an ordinary one-process ``score``.  The parser
and the command live in :mod:`swapkl.distributed` (its ``-m`` entry point); this module registers them.
"""
from __future__ import annotations

from swapkl.distributed import add_cli_args, main, run_cli

run = run_cli
__all__ = ["register", "run", "main"]


def register(sub) -> None:
    p = sub.add_parser("score-distributed", help="score split over torchrun ranks (one shard of pairs per rank)")
    add_cli_args(p)
    p.set_defaults(func=run_cli)
