"""One SwapEngine sweep of both protocols on the built-in default model, timed (formerly engine_before_after.py).

    python -m benchmarks run engine_sweep [--prompts 4] [--tokens 32] [--pairs adjacent] [--positions all]
    python -m benchmarks compare b052114 HEAD engine_sweep --rounds 3 -- --prompts 4 --tokens 32

One :class:`swapkl.scoring.engine.SwapEngine` sweep on the built-in default model (SmolLM2-135M, float32, the
converted folder in the cache): WikiText-like random ids from a fixed seed, one intra-op thread (so the two sides
of a ``compare`` never share a core; one thread: CPU seconds are what the sweep costs, less disturbed than wall time
by other work on the machine).  Prints and writes (``--json``) the wall and CPU seconds of the sweep and every
pair's mean KL in nats: ``compare`` reports the median CPU ratio HEAD / BASE and the largest KL difference between
the two commits (the engine's numbers must not move).  The earlier hand-written before/after run's figures:
``benchmarks/results/engine_before_after.json``.  The model option ``--tiny`` (a random 4-layer Llama, no cache)
makes a seconds-long run that proves the plumbing.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def _model(tiny: bool):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if tiny:
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
        return LlamaForCausalLM(cfg).eval()
    from swapkl.model.builtin import default_model_dir

    return AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--pairs", default="adjacent")
    ap.add_argument("--positions", default="all")
    ap.add_argument("--tiny", action="store_true", help="a random 4-layer Llama instead of the default (seconds)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from swapkl.contract import pair_list
    from swapkl.scoring.engine import SwapEngine

    model = _model(a.tiny)
    L = model.config.num_hidden_layers
    ids = torch.randint(0, model.config.vocab_size, (a.prompts, a.tokens), generator=torch.Generator().manual_seed(0))
    pairs = pair_list(a.pairs, L)
    with torch.no_grad():
        t0, c0 = time.perf_counter(), time.process_time()
        got = SwapEngine(model, ids, positions=a.positions).sweep(pairs)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    kl = {f"{i}-{j}:{k}": float(v.double().mean()) for (i, j), d in got.items() for k, v in d.items()}
    res = {"model": "random 4-layer Llama (--tiny)" if a.tiny else "SmolLM2-135M-Instruct (built-in default, float32)",
           "contract": {"prompts": a.prompts, "tokens": a.tokens, "pairs": a.pairs, "positions": a.positions},
           "sweep_seconds": round(secs, 4), "sweep_cpu": round(cpu, 4), "kl": kl}
    print(json.dumps({k: v for k, v in res.items() if k != "kl"}))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
