#!/usr/bin/env python3
"""The fused KL against today's unfused one, measured in one run on the same inputs (issue 29).

    python3 -m benchmarks run kl_fused                  # the CPU: chunked (what 'auto' picks there) vs plain
    python3 -m benchmarks run kl_fused --device cuda    # a GPU: compiled (what 'auto' picks there) vs plain
    python3 -m benchmarks run kl_fused --compiled       # also torch.compile on the CPU (about a minute to build)

The inputs are one KL chunk as the engine makes it: the base ``p`` and ``log p`` (float32) and a variant's logits
``[rows, T, V]`` in float32 and in bf16 (a bf16 model's head), V = 49152 (SmolLM2) and 50304 (Pythia).  Each
implementation runs ``--reps`` times, interleaved with the others (a busy machine slows all alike), and the best
time counts.  Prints one line per case and the ratio unfused / fused (> 1: the fused one is faster), then a JSON
line with everything.
"""
from __future__ import annotations

import argparse
import json
import time


import torch

from swapkl.scoring.kl import KLFunction, base_distribution, kl_from_logits


def _time(fn, args: tuple, dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t = time.perf_counter()
    fn(*args)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--positions", type=int, default=256, help="rows x T of the chunk (default 4 x 64)")
    ap.add_argument("--vocab", default="49152,50304")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads on the CPU")
    ap.add_argument("--compiled", action="store_true", help="also time torch.compile on the CPU")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    fused_name = "compiled" if dev.type == "cuda" else "chunked"
    impls = {"plain": KLFunction("plain", dev), fused_name: KLFunction("auto", dev)}
    if a.compiled and dev.type != "cuda":
        impls["compiled"] = KLFunction("compiled", dev)
    rows = []
    print(f"device {dev} (torch {torch.__version__}, {torch.get_num_threads()} threads), {a.positions} positions, "
          f"best of {a.reps}")
    for V in (int(v) for v in a.vocab.split(",")):
        g = torch.Generator().manual_seed(V)
        zb = torch.randn(4, a.positions // 4, V, generator=g) * 3
        z = zb + torch.randn(zb.shape, generator=g)
        p, logp = (t.to(dev) for t in base_distribution(zb))
        for dtype in (torch.float32, torch.bfloat16):
            logits = z.to(dev, dtype)
            want = kl_from_logits(p, logp, logits)
            warm = {}
            for name, f in impls.items():  # warm-up: allocator, and the compiled KL's build
                warm[name] = _time(f, (p, logp, logits), dev)
            best = {name: float("inf") for name in impls}
            for _ in range(a.reps):
                for name, f in impls.items():
                    best[name] = min(best[name], _time(f, (p, logp, logits), dev))
            diffs = {name: float((f(p, logp, logits).double() - want.double()).abs().max()) for name, f in impls.items()}
            row = {"vocab": V, "logits": str(dtype).replace("torch.", ""), "ms": {k: v * 1e3 for k, v in best.items()},
                   "ratio_unfused_over_fused": best["plain"] / best[fused_name],
                   "max_abs_diff_vs_plain": diffs, "used": {k: f.record for k, f in impls.items()},
                   "first_call_s": warm}
            if "compiled" in impls and fused_name != "compiled":
                row["ratio_unfused_over_compiled"] = best["plain"] / best["compiled"]
            rows.append(row)
            extra = f", compiled {best['compiled'] * 1e3:.1f} ms" if "compiled" in best and fused_name != "compiled" else ""
            print(f"V={V:6d} {row['logits']:8s} plain {best['plain'] * 1e3:7.1f} ms  {fused_name} "
                  f"{best[fused_name] * 1e3:7.1f} ms  ratio {row['ratio_unfused_over_fused']:.2f}x  "
                  f"max |diff| {diffs[fused_name]:.1e}{extra}")
    print(json.dumps({"device": str(dev), "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "positions": a.positions, "reps": a.reps, "cases": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
