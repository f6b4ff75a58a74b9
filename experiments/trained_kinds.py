"""Swap-KLs of tiny models of each new kind of stack, trained for 200 steps (tests/support/trained.py), one run.

    python -m experiments run trained_kinds [--steps 200] [--json out.json]

No package registry offers a real checkpoint of most of these kinds small enough for this machine, so each kind
(BLOOM, Gemma-2, Mamba, Jamba, DeepSeek-V3, EXAONE-4) is a 4-layer, width-64 byte-level LM trained on WikiText-2
(the shipped copy's first 80 %; held-out loss on the next 10 %, scoring prompts from the last 10 %: disjoint).
Prints per kind the held-out loss before and after training (nats per byte), and per per-layer definition the
adjacent pairs' replacement KL (mean of both directions) and interchange KL (nats, mean over 8 prompts x 32
positions), the median interchange / replacement ratio and the pairs left n/a.  Numbers of trained toy models,
for the shape of the answer on each kind, not claims about the real families.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


#: the configuration of the run the docs quote: the runner (python -m experiments run trained_kinds) passes each as --key value unless the command line gives it
CONFIG = {
    'steps': 200,
}


def main() -> None:
    from support.trained import KINDS, measured, scoring_prompts, train_tiny

    from swapkl.contract import PER_LAYER
    from swapkl.support.check import widest

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = {}
    for kind, what in KINDS.items():
        model, record = train_tiny(kind, steps=a.steps)
        ids = scoring_prompts(n=8, tokens=32)
        model, dtype = widest(model, ids)
        row = {"kind": what, "dtype": str(dtype).removeprefix("torch."),
               **{k: round(v, 4) for k, v in record.items()}}
        for per_layer in PER_LAYER:
            m = measured(model, ids, per_layer)
            ratio = [i / r for i, r in zip(m["interchange"], m["replacement"])]
            row[per_layer] = {"pairs": m["pairs"], "replacement": [round(x, 4) for x in m["replacement"]],
                              "interchange": [round(x, 4) for x in m["interchange"]], "n/a": m["n/a"],
                              "median_I_over_R": round(statistics.median(ratio), 3) if ratio else None}
        out[kind] = row
        print(json.dumps({kind: row}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
