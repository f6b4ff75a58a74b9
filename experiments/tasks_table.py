"""The closing-note table of issue 22: base accuracy and each of the five methods (replacement-guided,
interchange-guided, recommend, BI, random) at n = 1..4 with lm-eval's stderr, on the local fixture task.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 SWAPKL_CACHE=... python -m experiments run tasks_table [MODEL] [--limit 40]
        [--json experiments/results/tasks-default-five.json]
    python -m experiments run tasks_table --table FILE.json        # print the table of an existing 'swapkl tasks --json' file

Run from the checkout's root (the fixture task's data path is relative to it).  MODEL defaults to ``default`` (the
built-in SmolLM2-135M-Instruct).  It runs, as a user would::

    python -m swapkl tasks MODEL --methods replacement,interchange,recommend,bi,random --budget 4 --tokens 32
        --tasks tinystories_mc --include-path tests/fixtures/tasks --limit 40 --seeds 5 --json OUT

then prints, from the JSON, one markdown table per metric (acc, acc_norm): one row per method with its removed sets,
one column per n = 0..4, each cell ``value ± stderr``, the contract below, the run's evaluations / cache hits /
seconds, and the command a user with the hub runs for the standard tasks.

The task-accuracy cache is keyed per (model, removed set, task, version, limit, few-shot): with the same score
contract (``--tokens 32``, 16 prompts) and limit 40, the 13 models of experiments/results/tasks-default-limit40.json
(replacement, interchange, BI) come from the cache of that run when SWAPKL_CACHE points at it; the new ones are
recommend's sets and the random seeds' (about 4 + 20 models, fewer where sets coincide) plus recommend's
calibration search.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

METHODS = "replacement,interchange,recommend,bi,random"
HUB_TASKS = "hellaswag,arc_easy,piqa,winogrande,lambada_openai"


#: the configuration of the run the docs quote: the runner (python -m experiments run tasks_table) passes each as --key value unless the command line gives it
CONFIG = {
    'budget': 4,
    'limit': 40,
    'seeds': 5,
    'prompts': 16,
    'tokens': 32,
    'spacing': 1,
    'task': 'tinystories_mc',
    'include_path': 'tests/fixtures/tasks',
}


def command(a) -> list[str]:
    return [sys.executable, "-m", "swapkl", "tasks", a.model, "--methods", a.methods, "--budget", str(a.budget),
            "--tokens", str(a.tokens), "--prompts", str(a.prompts), "--tasks", a.task, "--include-path",
            a.include_path, "--limit", str(a.limit), "--seeds", str(a.seeds), "--spacing", str(a.spacing), "--json",
            a.json] + (["--include-boundary"] if a.include_boundary else [])


def table(path: str) -> str:
    from swapkl.views import tasks as tv

    r = tv.load_tasks(path)
    out = [tv.markdown_table(r, m) for m in tv.figure_metrics(r)]
    st = r.stats or {}
    out.append(f"run: {st.get('evaluations')} lm-eval evaluations, {st.get('cache_hits')} from the cache, "
               f"{st.get('variants')} models, {st.get('seconds', 0):.0f} s")
    spec = "default" if r.model.get("kind") == "builtin" else (r.model.get("id") or "MODEL")
    out.append(f"with the hub, the standard tasks: python -m swapkl tasks {spec} --methods "
               f"{','.join(r.methods)} --budget {r.contract.get('budget')} --tasks {HUB_TASKS} --json tasks.json")
    return "\n\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--table", default=None, metavar="FILE.json", help="only print the table of this file")
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--spacing", type=int, default=1)
    ap.add_argument("--include-boundary", action="store_true", help="(stories260K: 5 layers, budget > 1)")
    ap.add_argument("--task", default="tinystories_mc")
    ap.add_argument("--include-path", default="tests/fixtures/tasks")
    ap.add_argument("--json", default="experiments/results/tasks-default-five.json")
    a = ap.parse_args()
    if a.table is None:
        cmd = command(a)
        print("$ " + " ".join(cmd[1:]).replace("-m swapkl", "python -m swapkl", 1), flush=True)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT)
        if r.returncode != 0:
            return r.returncode
        print(f"wall time {time.perf_counter() - t0:.0f} s", flush=True)
    print(table(a.table or a.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
