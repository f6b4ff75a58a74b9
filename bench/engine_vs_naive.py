"""Engine vs the plain batch-of-one implementation, same inputs, one run.

    python bench/engine_vs_naive.py [--layers 12] [--hidden 256] [--prompts 8] [--tokens 64] [--family llama]

Builds a random-initialised model of the given shape (no download), computes both protocols for ALL pairs
with swapkl.reference.reference_sweep (every variant a full forward from the token ids, batch of one, weights
copied in with load_state_dict: how the paper's scripts work) and with swapkl.engine.SwapEngine, checks that
the numbers agree, and prints both times and their ratio.  Ratios only: this machine is noisy and shared.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import tiny_model  # noqa: E402
from swapkl.contract import pair_list  # noqa: E402
from swapkl.engine import SwapEngine  # noqa: E402
from swapkl.reference import reference_sweep  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="llama", choices=["llama", "qwen3", "gpt_neox", "gpt2"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--pairs", default="all")
    ap.add_argument("--positions", default="all", choices=["all", "last"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = tiny_model(a.family, num_layers=a.layers, hidden=a.hidden, vocab=a.vocab)
    ids = torch.randint(0, a.vocab, (a.prompts, a.tokens), generator=torch.Generator().manual_seed(0))
    pairs = pair_list(a.pairs, a.layers)

    t0 = time.perf_counter()
    ref = reference_sweep(model, ids, pairs, positions=a.positions)
    t_naive = time.perf_counter() - t0

    t0 = time.perf_counter()
    eng = SwapEngine(model, ids, positions=a.positions)
    got = eng.sweep(pairs)
    t_engine = time.perf_counter() - t0

    err = max((got[p][k].double() - ref[p][k]).abs().max().item() for p in pairs for k in ref[p])
    out = {
        "shape": {"family": a.family, "layers": a.layers, "hidden": a.hidden, "vocab": a.vocab},
        "inputs": {"prompts": a.prompts, "tokens": a.tokens, "pairs": a.pairs, "n_pairs": len(pairs),
                   "positions": a.positions, "variants": 3 * len(pairs)},
        "naive_seconds": round(t_naive, 3),
        "engine_seconds": round(t_engine, 3),
        "speedup": round(t_naive / t_engine, 2),
        "block_evals_ratio": round(eng.stats.naive_block_calls / max(1, eng.stats.block_calls), 3),
        "max_abs_diff_nats": err,
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
