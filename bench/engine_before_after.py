"""The engine on the default model, this tree against an earlier commit, interleaved in one run.

    python bench/engine_before_after.py [--base b052114] [--rounds 3] [--prompts 4] [--tokens 32]
                                        [--pairs adjacent] [--positions all] [--json out.json]

Checks out ``--base`` (default: the last commit before blocks of any structure and batch-shaped block
arguments) into a temporary git worktree and times, in child processes that alternate base / this tree for
``--rounds`` rounds, one :class:`swapkl.scoring.engine.SwapEngine` sweep of both protocols on the built-in
default model (SmolLM2-135M, float32, the converted folder in ``cache/``): the same token ids in both
(WikiText-like random ids from a fixed seed), one intra-op thread per child so the two never share a core.

Prints per round the wall and CPU seconds of each side (one thread: CPU seconds are what the sweep costs, less
disturbed than wall time by other work on the machine), the median CPU ratio **this / base** (< 1: this tree faster) and the
largest difference between the two sides' KLs in nats (the engine's numbers must not move).  Ratios only: the
machine is shared and noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from swapkl.contract import pair_list
from swapkl.model.builtin import default_model_dir
from swapkl.scoring.engine import SwapEngine
from transformers import AutoModelForCausalLM
a = json.loads(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(default_model_dir(a["cache"]), dtype=torch.float32).eval()
L = model.config.num_hidden_layers
ids = torch.randint(0, model.config.vocab_size, (a["prompts"], a["tokens"]),
                    generator=torch.Generator().manual_seed(0))
pairs = pair_list(a["pairs"], L)
with torch.no_grad():
    t0, c0 = time.perf_counter(), time.process_time()
    got = SwapEngine(model, ids, positions=a["positions"]).sweep(pairs)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
kl = {f"{i}-{j}:{k}": float(v.double().mean()) for (i, j), d in got.items() for k, v in d.items()}
print(json.dumps({"seconds": secs, "cpu": cpu, "kl": kl}))
"""


def _child(tree: Path, args: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="b052114")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--pairs", default="adjacent")
    ap.add_argument("--positions", default="all")
    ap.add_argument("--json")
    a = ap.parse_args()
    args = {"cache": str(ROOT / "cache"), "prompts": a.prompts, "tokens": a.tokens, "pairs": a.pairs,
            "positions": a.positions}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), a.base], check=True)
        try:
            rounds = []
            for r in range(a.rounds):
                b = _child(base, args)
                h = _child(ROOT, args)
                rounds.append({"base_s": round(b["seconds"], 3), "this_s": round(h["seconds"], 3),
                               "base_cpu_s": round(b["cpu"], 3), "this_cpu_s": round(h["cpu"], 3),
                               "ratio": round(h["cpu"] / b["cpu"], 3)})
                print(json.dumps({"round": r, **rounds[-1]}), flush=True)
            diff = max(abs(h["kl"][k] - b["kl"][k]) for k in b["kl"])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    res = {"base": a.base, "contract": {k: args[k] for k in ("prompts", "tokens", "pairs", "positions")},
           "model": "SmolLM2-135M-Instruct (built-in default, float32)", "rounds": rounds,
           "median_ratio_this_over_base": round(statistics.median(x["ratio"] for x in rounds), 3),
           "max_kl_difference_nats": diff}
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
