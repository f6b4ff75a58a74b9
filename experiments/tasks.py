"""Benchmark: task accuracy of 2 methods x budget 4 (8 pruned models + the base) in memory vs 9 ``lm_eval`` CLI runs.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python -m experiments run tasks [MODEL] [--methods replacement,interchange]
        [--budget 4] [--include-boundary --spacing 0] [--task tinystories_mc --include-path tests/fixtures/tasks]

Run from the checkout's root (the fixture task's data path is relative to it).  MODEL defaults to
../shared/models/stories260K (5 layers: use ``--include-boundary --spacing 0`` for budget 4); for the built-in default
(SmolLM2-135M-Instruct): ``SWAPKL_CACHE=... python -m experiments run tasks default``.  Both sides evaluate the same 9 models
(the removal sets the two methods choose, :func:`swapkl.removal.tasks.removal_sets`, computed once beforehand and not
timed) on the same task, batch size and device, in one run:

* in memory: one model load, one lm-eval task index, then for each variant ``simple_evaluate`` on an ``HFLM``
  around :func:`~swapkl.surgery.blocks.pruned_copy` (:func:`swapkl.measure.lmeval.evaluate`), no cache;
* CLI: each variant written with :func:`~swapkl.surgery.prune.save_pruned` (export time reported apart), then
  ``python -m lm_eval --model hf --model_args pretrained=DIR ...`` as a separate process (what a user does).

Prints both times, the ratio (target <= 0.5x) and the largest metric difference between the two sides; and the
in-memory path again with prefix sharing (:mod:`swapkl.measure.prefix`), its time against the plain in-memory
path and whether every metric is identical (``--no-cli``: only the two in-memory paths).
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
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


#: the configuration of the run the docs quote: the runner (python -m experiments run tasks) passes each as --key value unless the command line gives it
CONFIG = {
    'methods': 'replacement,interchange',
    'budget': 4,
    'spacing': 1,
    'task': 'tinystories_mc',
    'include_path': 'tests/fixtures/tasks',
    'batch_size': 16,
    'prompts': 16,
    'tokens': 64,
}


def _variants(a) -> list[tuple[str, list[int]]]:
    """(label, removed) for the base and each method's n = 1..budget (computed before any timing)."""
    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.removal.plan import RemovalPlan, RunHooks
    from swapkl.removal.tasks import removal_sets
    from swapkl.scoring.score import score

    ck = load_checkpoint(a.model, device="cpu")
    res = score(ck, Contract(prompts=a.prompts, tokens=a.tokens))
    scores = {"replacement": res.replacement(), "interchange": res.interchange()}
    plan = RemovalPlan(a.budget, tuple(a.methods.split(",")), spacing=a.spacing, exclude_boundary=not a.include_boundary)
    sets = removal_sets(ck.model, ck.tokenizer, scores, plan, RunHooks(identity=ck.identity))
    out = [("base", [])]
    for name, o in sets.items():
        out += [(f"{name} n={k + 1}", sorted(int(i) for i in s)) for k, s in enumerate(o.sets)]
    return out


def in_memory(a, variants, share: bool = False) -> tuple[float, dict, float]:
    """One model load, one task index, then every variant (the base first).  ``share``: the variants start from the
    base model's hidden states entering their first removed layer (swapkl.measure.prefix)."""
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.measure import lmeval
    from swapkl.measure.prefix import PrefixStore
    from swapkl.surgery.blocks import pruned_copy

    t0 = time.perf_counter()
    ck = load_checkpoint(a.model, device="cpu")
    tm = lmeval.task_manager(lmeval.check_include_path(a.include_path) if a.include_path else None)
    task = lmeval.load_task(tm, a.task)
    store = PrefixStore([min(r) for _, r in variants if r]) if share else None
    out = {}
    t_eval = 0.0
    for label, removed in variants:
        t1 = time.perf_counter()
        model = pruned_copy(ck.model, removed) if removed else (store.recording(ck.model) if share else ck.model)
        if share and removed:
            store.attach(model, removed)
        out[label] = lmeval.evaluate(model, ck.tokenizer, task, tm, limit=a.limit, batch_size=a.batch_size)["metrics"]
        t_eval += time.perf_counter() - t1
    if share:
        print(f"  prefix sharing: {store.stats}, {store.bytes / 1e6:.0f} MB of states", flush=True)
    print(f"  the {len(variants)} evaluations alone: {t_eval:.1f}s", flush=True)
    return time.perf_counter() - t0, out, t_eval


def cli(a, variants, tmp: Path) -> tuple[float, float, dict]:
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.measure.lmeval import rows_of
    from swapkl.surgery.prune import save_pruned

    t0 = time.perf_counter()
    ck = load_checkpoint(a.model, device="cpu")
    folders = [save_pruned(ck.model, removed, tmp / f"v{i}", tokenizer=ck.tokenizer, identity=ck.identity)
               for i, (_, removed) in enumerate(variants)]
    t_export = time.perf_counter() - t0
    del ck
    out = {}
    t1 = time.perf_counter()
    for i, ((label, _), folder) in enumerate(zip(variants, folders)):
        cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={folder}",
               "--tasks", a.task, "--batch_size", str(a.batch_size), "--device", "cpu",
               "--output_path", str(tmp / f"out{i}")]
        if a.include_path:
            cmd += ["--include_path", a.include_path]
        if a.limit:
            cmd += ["--limit", str(a.limit)]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"lm_eval failed on {label}: {r.stderr[-1500:]}")
        (res,) = list((tmp / f"out{i}").rglob("results_*.json"))
        out[label] = rows_of(json.loads(res.read_text()))["metrics"]
        print(f"  cli {label}: {time.perf_counter() - t1:.0f}s so far", file=sys.stderr, flush=True)
    return t_export, time.perf_counter() - t1, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(ROOT / ".." / "shared" / "models" / "stories260K"))
    ap.add_argument("--methods", default="replacement,interchange")
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--spacing", type=int, default=1)
    ap.add_argument("--include-boundary", action="store_true")
    ap.add_argument("--task", default="tinystories_mc")
    ap.add_argument("--include-path", default="tests/fixtures/tasks")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-cli", action="store_true", help="time the two in-memory paths only")
    a = ap.parse_args()

    variants = _variants(a)
    print(f"{len(variants)} models: " + "; ".join(f"{lab} {rem}" for lab, rem in variants), flush=True)
    t_mem, mem, e_mem = in_memory(a, variants)
    print(f"in memory: {t_mem:.1f}s", flush=True)
    t_pre, pre, e_pre = in_memory(a, variants, share=True)  # its task index is the first run's (one per process)
    same = pre == mem
    print(f"in memory with prefix sharing: {t_pre:.1f}s; the evaluations alone {e_pre:.1f}s against {e_mem:.1f}s: "
          f"{e_pre / e_mem:.3f}x the plain in-memory path (metrics {'identical' if same else 'DIFFER'})", flush=True)
    if a.no_cli:
        return 0 if same else 1
    with tempfile.TemporaryDirectory(prefix="swapkl-bench-tasks-") as tmp:
        t_export, t_cli, ref = cli(a, variants, Path(tmp))
    diff = max(abs(mem[lab][t][m] - ref[lab][t][m]) for lab in mem for t in mem[lab] for m in mem[lab][t])
    print(f"{len(variants)} lm_eval CLI runs: {t_cli:.1f}s (+ {t_export:.1f}s to export the folders)")
    print(f"ratio in-memory / CLI runs: {t_mem / t_cli:.3f}x  (with the exports: {t_mem / (t_cli + t_export):.3f}x); "
          f"target <= 0.5x")
    print(f"largest metric difference between the two sides: {diff:.2g}")
    for lab in mem:
        print(f"  {lab:<20} " + ", ".join(f"{t} {m} {v:.4f}" for t in mem[lab] for m, v in mem[lab][t].items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "variants": variants, "in_memory_s": t_mem,
                                            "cli_s": t_cli, "export_s": t_export, "ratio": t_mem / t_cli,
                                            "eval_s": e_mem, "prefix_eval_s": e_pre, "prefix_ratio": e_pre / e_mem,
                                            "prefix_identical": same,
                                            "max_diff": diff, "metrics": mem}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
