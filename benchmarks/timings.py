"""The wall-clock figures the tests no longer bound (a test that fails on a loaded machine says nothing about the
code), measured here and printed as one JSON object, each next to the limit its test used to assert:

    HF_HUB_OFFLINE=1 python -m benchmarks run timings [--json benchmarks/results/timings.json] [--skip-default]

* ``demo_tiny_s``: the demo trajectory's TINY run of tests/trajectory/test_demo_trajectory.py (was: < 20 s);
* ``demo_budget``: a demo run with a 5 s budget and no step cap: its ``seconds_total`` and the overrun (was: < 5 +
  2 s; the test now runs the planner on a virtual clock);
* ``gguf_tiny_export_load_s``: transformers loading the pruned tiny Llama GGUF the export writes (was: < 60 s);
* ``default_dir_reuse_s``: the second ``builtin.default_model_dir()``, a converted folder reused (was: < 2 s;
  needs the built-in model, ``--skip-default`` leaves it out);
* ``deep_json_refusal_s``: refusing a 200,000-deep JSON result (was: < 5 s).

Run it on a quiet machine; every figure is also the median of ``--repeat`` runs where a run is short.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = dict(steps=20, seconds=120, checkpoints=3, seed=3, layers=4, hidden=32, heads=2, vocab=320, seq_len=32,
            batch_size=8, lr=3e-3, warmup=5, heldout_windows=8, threads=1)


def timed(fn, repeat: int = 1) -> float:
    """Median wall seconds of ``repeat`` calls of ``fn()``."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def demo(tmp: Path) -> dict:
    from swapkl.trajectory import demo as D

    tiny = timed(lambda: D.train_demo_trajectory(tmp / "tiny", **TINY), 1)
    out = D.train_demo_trajectory(tmp / "budget", **{**TINY, "steps": 10**6, "seconds": 5})
    m = json.loads((out / D.MANIFEST).read_text())
    return {"demo_tiny_s": round(tiny, 2), "demo_tiny_limit_was_s": 20,
            "demo_budget": {"budget_s": 5, "seconds_total": m["seconds_total"],
                            "overrun_s": round(m["seconds_total"] - 5, 2), "planned_steps": m["planned_steps"],
                            "final_step": m["final_step"], "stopped_early": m["stopped_early"],
                            "overrun_limit_was_s": 2.0}}


def gguf_export(tmp: Path, repeat: int) -> dict:
    from support.gguf_tiny import write_tiny_llama_gguf
    from transformers import AutoModelForCausalLM

    from swapkl.surgery.gguf_prune import prune_gguf

    src = write_tiny_llama_gguf(tmp / "tiny.gguf", n_layers=5)
    prune_gguf(src, [1], tmp / "cut.gguf")
    s = timed(lambda: AutoModelForCausalLM.from_pretrained(str(tmp), gguf_file="cut.gguf"), repeat)
    return {"gguf_tiny_export_load_s": round(s, 3), "gguf_tiny_export_load_limit_was_s": 60}


def default_reuse(repeat: int) -> dict:
    from swapkl.model import builtin

    builtin.default_model_dir()  # converted once (into $SWAPKL_CACHE)
    return {"default_dir_reuse_s": round(timed(builtin.default_model_dir, repeat), 3), "default_dir_reuse_limit_was_s": 2}


def deep_json(repeat: int) -> dict:
    from swapkl.errors import UploadError
    from swapkl.scoring.results import SwapResult

    deep = "[" * 200_000 + "]" * 200_000

    def refuse():
        try:
            SwapResult.from_json(deep)
        except UploadError:
            return
        raise AssertionError("not refused")

    return {"deep_json_refusal_s": round(timed(refuse, repeat), 3), "deep_json_refusal_limit_was_s": 5}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--repeat", type=int, default=3, help="runs of each short measurement (median)")
    p.add_argument("--skip-default", action="store_true", help="leave out the built-in model's folder reuse")
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="swapkl-timings-") as d:
        tmp = Path(d)
        os.environ.setdefault("SWAPKL_CACHE", str(tmp / "cache"))
        out = {"machine": f"{os.cpu_count()} cores", "torch_threads": 1}
        out |= demo(tmp)
        out |= gguf_export(tmp, a.repeat)
        out |= deep_json(a.repeat)
        if not a.skip_default:
            out |= default_reuse(a.repeat)
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        a.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
