"""Engine vs the plain batch-of-one implementation, same inputs, one run.

    python -m benchmarks run engine_vs_naive [--layers 12] [--hidden 256] [--family llama] [--threads N] [--quick]

Builds a random-initialised 12-layer model (no download) and, for each setting below, computes both
protocols for ALL pairs (66 pairs, 198 variants) twice on the same token ids:

* **plain**: swapkl.scoring.reference.reference_sweep - every variant a full forward from the token ids, batch of one,
  weights copied in with load_state_dict, float32 log-softmax KL: how the paper's scripts work;
* **engine**: swapkl.scoring.engine.SwapEngine (prefix reuse, shared branch, batched suffixes, head only where scored).

Settings: ``paper-stems`` = 16 prompts x 16 tokens, last-position KL (the paper's GPT-2/Pythia static runs used
short sentence stems and the last token); ``windows`` = 8 x 64 tokens, KL at all positions (swapkl's canonical
contract).  Prints times, their ratio and the largest difference in nats as JSON.  Ratios only: this machine
is shared and noisy, so absolute times mean little.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {
    "paper-stems": {"prompts": 16, "tokens": 16, "positions": "last"},
    "windows": {"prompts": 8, "tokens": 64, "positions": "all"},
}


def run_one(model, vocab: int, layers: int, prompts: int, tokens: int, positions: str) -> dict:
    from swapkl.contract import pair_list
    from swapkl.scoring.engine import SwapEngine
    from swapkl.scoring.reference import reference_sweep

    ids = torch.randint(0, vocab, (prompts, tokens), generator=torch.Generator().manual_seed(0))
    pairs = pair_list("all", layers)
    t0 = time.perf_counter()
    ref = reference_sweep(model, ids, pairs, positions=positions, kl_dtype=torch.float32)
    t_naive = time.perf_counter() - t0
    t0 = time.perf_counter()
    eng = SwapEngine(model, ids, positions=positions)
    got = eng.sweep(pairs)
    t_engine = time.perf_counter() - t0
    err = max((got[p][k] - ref[p][k]).abs().max().item() for p in pairs for k in ref[p])
    return {"prompts": prompts, "tokens": tokens, "positions": positions, "pairs": len(pairs),
            "variants": 3 * len(pairs), "plain_seconds": round(t_naive, 3), "engine_seconds": round(t_engine, 3),
            "speedup": round(t_naive / t_engine, 2),
            "block_evals_ratio": round(eng.stats.naive_block_calls / max(1, eng.stats.block_calls), 3),
            "max_abs_diff_nats": err}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="llama", choices=["llama", "qwen3", "gpt_neox", "gpt2"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ", ".join(SETTINGS))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    ap.add_argument("--quick", action="store_true", help="4 layers, for a smoke test")
    a = ap.parse_args(argv)
    from conftest import tiny_model

    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    layers = 4 if a.quick else a.layers
    model = tiny_model(a.family, num_layers=layers, hidden=a.hidden, vocab=a.vocab)
    out = {"model": {"family": a.family, "layers": layers, "hidden": a.hidden, "vocab": a.vocab,
                     "random_init": True}, "torch_threads": torch.get_num_threads(), "runs": {}}
    for name in a.settings.split(","):
        cfg = dict(SETTINGS[name])
        if a.quick:
            cfg["prompts"] = 2
        out["runs"][name] = run_one(model, a.vocab, layers, **cfg)
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
