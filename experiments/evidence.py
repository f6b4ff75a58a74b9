"""Benchmark and tables of ``swapkl evidence`` (issue 21's "Must show"), measured in one run.

    HF_HUB_OFFLINE=1 python -m experiments run evidence [MODEL] [--max-words N] [--budget 4] [--threads 2] [--no-ratio]

MODEL defaults to ../shared/models/stories260K; ``default`` is the built-in SmolLM2-135M-Instruct.  Prints:

1. the ground-truth sweep's cost against L independent evaluations on the same windows (each independent one is
   ``evaluate_ppl(pruned_copy(model, [l]), reference=base)``, plus the one base run that gives the reference;
   the sweep is :func:`swapkl.evidence.ground_truth.single_removal_sweep`), with the largest difference between them;
2. the cold and cached wall time of ``python -m swapkl evidence`` (a fresh cache folder, then the same folder);
3. the cached run's tables: ground truth, ρ/τ [CI] of each signal against each ground truth, stability at
   n = 1..budget, the region agreement, with the contract caption.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
STORIES = ROOT / ".." / "shared" / "models" / "stories260K"
WIKI = ROOT / ".." / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


#: the configuration of the run the docs quote: the runner (python -m experiments run evidence) passes each as --key value unless the command line gives it
CONFIG = {
    'budget': 4,
    'threads': 2,
    'cli_args': '',
}


def sweep_ratio(model_spec: str, eval_text: str, max_words: int | None) -> None:
    import numpy as np

    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.measure import evaluate as E
    from swapkl.evidence.ground_truth import single_removal_sweep
    from swapkl.scoring.corpora import from_file
    from swapkl.surgery.prune import pruned_copy

    ck = load_checkpoint(model_spec)
    ev = E.get_evaluator("matched")
    if max_words:
        ev = E.Evaluator(f"matched@{max_words}w", max_words, ev.window, ev.stride)
    ids = E.eval_ids(from_file(eval_text), ck.tokenizer, ev)
    L = ck.num_layers
    t = time.perf_counter()
    sw = single_removal_sweep(ck.model, ids, ev.window, ev.stride)
    t_sweep = time.perf_counter() - t
    t = time.perf_counter()
    base = E.evaluate_ppl(ck.model, ids, ev.window, ev.stride, capture_reference=True)
    plain = {k: E.evaluate_ppl(pruned_copy(ck.model, [k]), ids, ev.window, ev.stride, reference=base.reference)
             for k in range(L)}
    t_plain = time.perf_counter() - t
    dn = max(float(np.max(np.abs(sw.removed[k].nll - plain[k].nll) / plain[k].counts)) for k in range(L))
    dk = max(float(np.max(np.abs(sw.removed[k].kl - plain[k].kl) / plain[k].counts)) for k in range(L))
    print(f"ground-truth sweep, {L} layers, {ids.numel()} tokens, {len(base.counts)} windows ({ev.name}):")
    print(f"  prefix-reuse sweep {t_sweep:8.1f} s   L independent evaluations + base {t_plain:8.1f} s   "
          f"ratio {t_sweep / t_plain:.3f}x (target <= 0.6x; block-count ideal "
          f"{(L + L * (L - 1) / 2) / (L + L * (L - 1)):.3f}x)")
    print(f"  largest per-token difference: NLL {dn:.2e} nats, KL {dk:.2e} nats")


def cli_times(model_spec: str, eval_text: str, extra: list[str]) -> dict:
    cache = tempfile.mkdtemp(prefix="swapkl-evidence-bench-")
    env = dict(os.environ, SWAPKL_CACHE=cache)
    if model_spec == "default" and Path("/tmp/vcache/models").is_dir():
        os.symlink("/tmp/vcache/models", Path(cache) / "models")  # the converted default model, not its results
    out = Path(cache) / "evidence.json"
    cmd = [sys.executable, "-m", "swapkl", "evidence", model_spec, "--eval-text", eval_text, "--evaluator", "matched",
           "--json", str(out), "--quiet", *extra]
    times = {}
    for run in ("cold", "cached"):
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        times[run] = time.perf_counter() - t
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    print(f"python -m swapkl evidence {model_spec} {' '.join(extra)}: cold {times['cold']:.1f} s, "
          f"cached {times['cached']:.1f} s (wall, one process each, model load included)")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(STORIES))
    ap.add_argument("--eval-text", default=str(WIKI))
    ap.add_argument("--max-words", type=int, default=None, help="a shorter, labelled evaluation text (quick runs)")
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-ratio", action="store_true")
    ap.add_argument("--cli-args", default="", help="more arguments for swapkl evidence (quoted)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    print(f"threads {a.threads}; model {a.model}")
    if not a.no_ratio:
        sweep_ratio(a.model, a.eval_text, a.max_words)
    extra = ["--budget", str(a.budget)] + (["--max-words", str(a.max_words)] if a.max_words else [])
    extra += a.cli_args.split()
    d = cli_times(a.model, a.eval_text, extra)
    from swapkl.evidence.report import text_tables

    print(text_tables(d))
    t = d["timing"]
    print("steps of the cold run are not kept; cached run steps (s since start): "
          + ", ".join(f"{m} {s:.1f}" for m, s in t["steps"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
