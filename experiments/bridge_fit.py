"""Fit time and peak memory of one linear bridge on the default model, at calibration sizes 4× apart (docs/repair.md).

    HF_HUB_OFFLINE=1 python -m experiments run bridge_fit [--tokens 8192,32768] [--span 20,23] [--form folded]

Each size runs in a fresh process: the built-in SmolLM2-135M (float32, CPU) is loaded, the calibration windows are cut
from the default corpus (WikiText-2's prompt region minus the default contract's scoring prompts), then
:func:`swapkl.repair.calibration.fit_bridges` fits the span's bridge.  Reported per size: wall seconds, CPU seconds
(``time.process_time``: every thread of the process), and the peak resident memory during the fit above the resident
memory just before it (sampled every 5 ms from /proc/self/statm), in MiB, after one warm-up forward of a batch (the
weights are mapped lazily by the load: without it the first forward's paging-in of ~0.5 GB of weights is counted).  The streamed fit holds the float64 normal
equations (2·d² · 8 bytes) and one batch of activations, so the peak should not grow with the calibration size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: the configuration of the run the docs quote: the runner (python -m experiments run bridge_fit) passes each as --key value unless the command line gives it
CONFIG = {
    'tokens': '8192,32768',
    'span': '20,23',
    'form': 'folded',
}


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one(tokens: int, span: tuple[int, int], form: str) -> dict:
    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.repair.calibration import calibration_text, fit_bridges
    from swapkl.scoring.score import contract_prompts

    ck = load_checkpoint("default", device="cpu")
    contract = Contract()
    corpus, prompts, _ = contract_prompts(ck, contract)
    calib = calibration_text(ck.tokenizer, corpus, prompts.description, contract.tokens, tokens, 256, 0)
    import torch

    with torch.inference_mode():  # page in the weights (a safetensors load maps them lazily) and warm the allocator
        ck.model(input_ids=calib.ids[:4], use_cache=False)
    peak, stop = [rss()], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.005)

    before = rss()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    w0, c0 = time.perf_counter(), time.process_time()
    fit = fit_bridges(ck.model, calib, [span], form)[span]
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    stop.set()
    th.join()
    return {"tokens": calib.description["tokens"], "span": list(span), "form": form, "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "peak_above_before_mib": round((peak[0] - before) / 2**20, 1),
            "residual": round(fit.fit["residual"], 4), "threads": __import__("torch").get_num_threads()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8192,32768")
    ap.add_argument("--span", default="20,23", help="the removed span [i, j) as i,j")
    ap.add_argument("--form", default="folded", choices=["folded", "residual"])
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    span = tuple(int(x) for x in a.span.split(","))
    if a.one is not None:
        print(json.dumps(one(a.one, span, a.form)))
        return 0
    for n in (int(x) for x in a.tokens.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--span", a.span, "--form", a.form],
                             capture_output=True, text=True, check=True)
        print(out.stdout.strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
