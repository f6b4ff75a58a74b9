"""What a sublayer sweep costs next to a block sweep of the same pair set (issue 28; docs/method.md "Sublayer units").

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 10 python -m experiments run units_cost [--repeats 3] \
        [--json experiments/results/units-cost.json]

Two cases: stories260K (tests/fixtures) on all pairs, and the built-in default (SmolLM2-135M-Instruct) on its
adjacent pairs, each with 4 prompts x 32 tokens.  For each unit (block, attention, mlp) the engine is built (the
baseline pass) and sweeps the pairs; the units run interleaved, ``--repeats`` times, and the median wall time and
process CPU time of the sweep (and the baseline's wall time) are kept (CPU time is the steadier figure on a shared
machine).  Prints and records the ratio sublayer / block per case, with the block
calls (prompt rows x blocks) each sweep ran: the engine runs the same calls for every unit, with other tensors.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

UNITS = ("block", "attention", "mlp")
CASES = (("stories260K", str(ROOT / "tests" / "fixtures" / "models" / "stories260K"), "all"),
         ("SmolLM2-135M-Instruct (default)", "default", "adjacent"))


#: the configuration of the run the docs quote: the runner (python -m experiments run units_cost) passes each as --key value unless the command line gives it
CONFIG = {
    'repeats': 3,
    'prompts': 4,
    'tokens': 32,
}


def measure(spec: str, pairs_spec: str, prompts: int, tokens: int, repeats: int) -> dict:
    import torch

    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.engine import SwapEngine
    from swapkl.scoring.score import contract_prompts

    ck = load_checkpoint(spec, device="cpu")
    contract = Contract(pairs=pairs_spec, prompts=prompts, tokens=tokens, device="cpu")
    _, pr, _ = contract_prompts(ck, contract)
    pairs = contract.pair_list(ck.num_layers)
    runs: dict = {u: {"sweep_s": [], "sweep_cpu_s": [], "baseline_s": []} for u in UNITS}
    calls: dict = {}
    means: dict = {}
    for _ in range(repeats):
        for unit in UNITS:
            t0 = time.perf_counter()
            eng = SwapEngine(ck.model, pr.ids, unit=unit)
            t1, c1 = time.perf_counter(), time.process_time()
            out = eng.sweep(pairs)
            t2, c2 = time.perf_counter(), time.process_time()
            runs[unit]["sweep_cpu_s"].append(round(c2 - c1, 4))
            runs[unit]["baseline_s"].append(round(t1 - t0, 4))
            runs[unit]["sweep_s"].append(round(t2 - t1, 4))
            calls[unit] = eng.stats.block_calls
            means[unit] = float(torch.stack([v["inter"] for v in out.values()]).mean())
            del eng, out
    med = {u: statistics.median(runs[u]["sweep_s"]) for u in UNITS}
    cpu = {u: statistics.median(runs[u]["sweep_cpu_s"]) for u in UNITS}
    return {"model": spec if spec == "default" else os.path.relpath(spec, ROOT), "num_layers": ck.num_layers,
            "pairs": pairs_spec, "n_pairs": len(pairs), "prompts": prompts, "tokens": tokens, "repeats": repeats,
            "runs": runs, "median_sweep_s": med, "median_sweep_cpu_s": cpu, "block_calls": calls,
            "mean_d_inter": {u: round(v, 6) for u, v in means.items()},
            "ratio_to_block": {u: round(med[u] / med["block"], 3) for u in UNITS if u != "block"},
            "cpu_ratio_to_block": {u: round(cpu[u] / cpu["block"], 3) for u in UNITS if u != "block"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args()
    import torch

    out = {"what": "median sweep wall (and CPU) time of a sublayer unit / of whole blocks, same pairs, same prompts",
           "command": "OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 10 python -m experiments run units_cost "
                      + " ".join(sys.argv[1:]),
           "host": {"cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version(), "machine": platform.machine()}, "cases": []}
    for name, spec, pairs in CASES:
        r = measure(spec, pairs, a.prompts, a.tokens, a.repeats) | {"name": name}
        out["cases"].append(r)
        print(f"{name}: {r['n_pairs']} pairs ({pairs}), {a.prompts} x {a.tokens}; median sweep "
              + ", ".join(f"{u} {r['median_sweep_s'][u]:.3f} s" for u in UNITS)
              + "; ratio " + ", ".join(f"{u}/block {v:.3f}" for u, v in r["ratio_to_block"].items())
              + " (CPU time " + ", ".join(f"{u}/block {v:.3f}" for u, v in r["cpu_ratio_to_block"].items()) + ")"
              + f"; block calls {r['block_calls']}", flush=True)
    if a.json:
        from swapkl.store import dump_json

        dump_json(out, a.json, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
