"""Both swap-KL depth profiles of the built-in default model for blocks, attention and MLP units, with the regime
verdict per unit (issue 28; docs/units.md).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 10 python -m experiments run units_default [--prompts 8 --tokens 64] \
        [--json experiments/results/units-default-profiles.json]

SmolLM2-135M-Instruct (30 layers), adjacent pairs, one contract per unit differing only in ``unit``; the score cache
is not used (every number computed in this run).  For each unit: d_repl (max of the two directions) and d_inter per
adjacent pair (i, i+1) with 95 % prompt-bootstrap CIs, the gap d_repl - d_inter, the noise floor, the regime
verdict (``swapkl.scoring.verdict.regime_verdict``: the 0.05 / 0.10-nat thresholds of docs/method.md §1, the same
for every unit) and the sweep's wall time.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


UNITS = ("block", "attention", "mlp")


#: the configuration of the run the docs quote: the runner (python -m experiments run units_default) passes each as --key value unless the command line gives it
CONFIG = {
    'prompts': 8,
    'tokens': 64,
}


def profile(res) -> dict:
    """The adjacent pairs' rows of ``res.pair_table()`` (d_repl, d_inter, their CIs), in depth order."""
    t = res.pair_table(ci=True)
    rows = t[(t["j"] - t["i"]) == 1].sort_values("i")
    cols = [c for c in rows.columns if c not in ("i", "j")]
    out = {"pairs": [[int(i), int(j)] for i, j in zip(rows["i"], rows["j"])]}
    for c in cols:
        out[c] = [None if not np.isfinite(v) else round(float(v), 6) for v in rows[c]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch

    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.verdict import regime_verdict
    from swapkl.scoring.score import score
    from swapkl.store import dump_json

    ck = load_checkpoint("default", device="cpu")
    out = {"model": ck.identity.get("display") or "default", "num_layers": ck.num_layers,
           "cpu_threads": torch.get_num_threads(), "units": {}}
    for unit in UNITS:
        c = Contract(pairs="adjacent", prompts=a.prompts, tokens=a.tokens, device="cpu", unit=unit)
        t0 = time.perf_counter()
        res = score(ck, c, use_cache=False)
        secs = time.perf_counter() - t0
        v = regime_verdict(res.replacement(), res.interchange())
        prof = profile(res)
        out["contract"] = {k: val for k, val in res.contract.items() if k != "unit"}
        out["units"][unit] = {"seconds": round(secs, 2), "noise_floor": res.noise_floor, "verdict": v,
                              "profile": prof}
        print(f"{unit:9s} {secs:6.1f} s  {v['regime']:9s} prefer {v['prefer']:11s} best d_repl "
              f"{v['evidence']['replacement']['min']:.4f} {tuple(v['evidence']['replacement']['best_pair'])}  "
              f"best d_inter {v['evidence']['interchange']['min']:.4f} "
              f"{tuple(v['evidence']['interchange']['best_pair'])}  below 0.10: "
              f"repl {v['evidence']['replacement']['below_threshold']}, "
              f"inter {v['evidence']['interchange']['below_threshold']} of {ck.num_layers - 1}", flush=True)
    if a.json:
        dump_json(out, a.json, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
