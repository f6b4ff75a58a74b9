"""Benchmark: removal curves with prefix sharing (a set whose first removed block is f runs blocks f.. from the
baseline's recorded hidden states) vs the plain path (every set's pruned copy evaluated in full), on the built-in
default model with the dashboard's CPU defaults (16 x 32 adjacent scores, the ``quick`` evaluator, the dashboard's
methods).

    HF_HUB_OFFLINE=1 python -m benchmarks run curves_prefix [MODEL] [--budget 4] [--rounds 2] [--methods sleb]

With ``--methods sleb`` the calibration trials share too: SLEB's trial sets start from the base's states on the
calibration text (``MethodContext.calib_result``).

Each round runs both paths once, in alternating order, each with a fresh in-memory memo (the scores come from the
cache).  Prints each run's CPU seconds (this process), the ratio of the sums, and whether every evaluation of the two
paths is bit-identical (per-window NLL and KL sums)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", default=None, help="comma-separated (default: the dashboard's)")
    a = ap.parse_args()

    import numpy as np

    from swapkl.jobs.defaults import default_contract, default_evaluator
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.removal import curves as C
    from swapkl.measure import prefix
    from swapkl.measure.memo import EvalMemo
    from swapkl.removal.methods import registry
    from swapkl.removal.plan import RemovalPlan, RunHooks
    from swapkl.scoring.score import score

    ck = load_checkpoint(a.model, device="cpu")
    contract, ev = default_contract("cpu"), default_evaluator("cpu")
    res = score(ck, contract)
    scores = {"replacement": res.replacement(), "interchange": res.interchange()}
    methods = tuple(a.methods.split(",")) if a.methods else registry.default_set("dashboard")
    plan = RemovalPlan(budget=a.budget, methods=methods, evaluator=ev)
    print(f"model {ck.identity.get('display')} ({ck.num_layers} layers), evaluator {ev.name} "
          f"({ev.max_words} words, window {ev.window}/{ev.stride}), budget {a.budget}, methods {', '.join(methods)}, "
          f"{contract.prompts}x{contract.tokens} scores")
    full_bytes = prefix.CURVES_STATES_BYTES
    cpu = {"shared": 0.0, "plain": 0.0}
    memos = {}
    for r in range(a.rounds):
        for side in (("shared", "plain") if r % 2 == 0 else ("plain", "shared")):
            prefix.CURVES_STATES_BYTES = full_bytes if side == "shared" else 0
            memo = EvalMemo()
            t = time.process_time()
            out = C.removal_curves(ck.model, ck.tokenizer, scores, plan, RunHooks(memo=memo, identity=ck.identity))
            dt = time.process_time() - t
            cpu[side] += dt
            memos[side] = memo
            print(f"round {r + 1} {side:6s}: {dt:6.1f} s CPU, {out.stats['evaluations']} evaluations, "
                  f"prefix {out.stats.get('prefix')}")
    prefix.CURVES_STATES_BYTES = full_bytes
    a_, b_ = memos["shared"].store, memos["plain"].store
    same = set(a_) == set(b_) and all(
        np.array_equal(a_[k].nll, b_[k].nll) and np.array_equal(a_[k].kl, b_[k].kl) for k in a_)
    print(f"bit-identical evaluations: {same} ({len(a_)} evaluations)")
    print(f"CPU shared / plain: {cpu['shared']:.1f} / {cpu['plain']:.1f} s = {cpu['shared'] / cpu['plain']:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
