"""The third matrix's cost against the replacement matrix's, measured in one run (docs/repair.md).

    HF_HUB_OFFLINE=1 python -m experiments run bridge_cost [--pairs all] [--prompts 16] [--tokens 64] [--calib-tokens 8192]

Loads the built-in SmolLM2-135M (float32, CPU unless --device), then, without the cache, times ``score()`` (both
swap-KL protocols: the replacement matrix and interchange come out of one sweep) and ``bridged_scores()`` (calibration
forwards and fits included) on the same contract, and prints wall and CPU seconds of each and their ratio.  The
acceptance target on the default with all pairs: bridged ≤ 1.5 × replacement.
"""
from __future__ import annotations

import argparse
import json
import sys
import time



#: the configuration of the run the docs quote: the runner (python -m experiments run bridge_cost) passes each as --key value unless the command line gives it
CONFIG = {
    'pairs': 'all',
    'prompts': 16,
    'tokens': 64,
    'calib_tokens': 8192,
    'form': 'folded',
    'device': 'cpu',
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="all")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--calib-tokens", type=int, default=8192)
    ap.add_argument("--form", default="folded")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.repair.bridged_kl import BridgeSettings, bridged_scores
    from swapkl.scoring.score import score

    ck = load_checkpoint("default", device=a.device)
    contract = Contract(pairs=a.pairs, prompts=a.prompts, tokens=a.tokens)
    out = {"pairs": a.pairs, "prompts": a.prompts, "tokens": a.tokens, "calib_tokens": a.calib_tokens,
           "device": str(ck.device)}
    w0, c0 = time.perf_counter(), time.process_time()
    score(ck, contract, use_cache=False)
    out["replacement_wall_s"], out["replacement_cpu_s"] = time.perf_counter() - w0, time.process_time() - c0
    w0, c0 = time.perf_counter(), time.process_time()
    res = bridged_scores(ck, contract, BridgeSettings(form=a.form, calib_tokens=a.calib_tokens), use_cache=False)
    out["bridged_wall_s"], out["bridged_cpu_s"] = time.perf_counter() - w0, time.process_time() - c0
    out["bridged_fit_s"], out["spans"] = res.meta["fit_seconds"], len(res.spans)
    out["ratio_wall"] = out["bridged_wall_s"] / out["replacement_wall_s"]
    out["ratio_cpu"] = out["bridged_cpu_s"] / out["replacement_cpu_s"]
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
