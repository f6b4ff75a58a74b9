"""Issue 37's comparison on the built-in default (docs/healing.md, "Every arm on the default"): the
interchange-guided sets at n = 1 and n = 4, healed by every objective × trained part with the same training tokens
and steps, measured on the same evaluation windows, on the shipped held-out text (a second domain no run trains on)
and on the fixture task through the tasks path.

    HF_HUB_OFFLINE=1 python -m experiments run heal_default_arms [--n 4,1] [--steps 30] [--limit 50] [--json OUT]

Each arm is one ``swapkl heal default --method interchange --n N …`` process with one intra-op thread (its CPU
seconds are the process's user + system time, read from ``getrusage``); the evaluations and the fine-tuned control
are cached between arms (``$SWAPKL_CACHE``), so an arm's CPU time holds its training and what no earlier arm
computed.  The arms (the rule, written before any result):

* ``lm/LoRA``, ``kd/LoRA``, ``kd+lm/LoRA`` (w 0.5): LoRA r8, lr 2e-3 (the default model's reduced recipe of
  docs/healing.md);
* ``kd/last-k``: the last 3 kept blocks and lm_head in full, lr 2e-4 (a tenth of LoRA's, as on stories260K);
* ``kd/bridge``: ``--repair bridge --train bridge``: the heal starts from the bridged cut (folded least-squares
  bridge, 8,192 calibration tokens) and trains LoRA and the bridge's W, lr 2e-3; its task rows are the raw cut, the
  bridged cut and the healed model.

KD: T = 1, top-64 teacher cache.  Every arm: 30 updates × 4 × 128 tokens (15,360 training tokens), warm-up 5,
seed 0; the ``matched`` evaluator shortened to 1,500 words; scores of the 16 × 32-token contract on adjacent pairs.

Printed per n and arm: the recovered share with its CI (each arm against its own control: the fine-tuned base for
``lm``/``kd+lm``, the unpruned base for ``kd``, as ``swapkl heal`` reports it), healed ΔPPL vs the base on both
texts with CIs, task accuracy, trainable parameters and CPU seconds; then each arm minus ``lm/LoRA`` with a paired
bootstrap CI over the shared windows (the project's 1,000 resamples, seed 0): recovered share (points) and healed
ΔPPL vs the base (points of the base PPL).  A CI that includes 0 is a tie.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "tests/fixtures/data/heldout/american-speeches.txt"
COMMON = ["--method", "interchange", "--steps", "30", "--batch", "4", "--seq-len", "128", "--warmup", "5",
          "--seed", "0", "--max-words", "1500", "--prompts", "16", "--tokens", "32", "--pairs", "adjacent",
          "--heldout-text", str(HELDOUT), "--tasks", "tinystories_mc", "--include-path",
          str(ROOT / "tests/fixtures/tasks"), "--quiet"]
ARMS = {
    "lm/LoRA": ["--objective", "lm", "--train", "lora", "--lr", "2e-3"],
    "kd/LoRA": ["--objective", "kd", "--train", "lora", "--lr", "2e-3"],
    "kd+lm/LoRA": ["--objective", "kd+lm", "--kd-weight", "0.5", "--train", "lora", "--lr", "2e-3"],
    "kd/last-k": ["--objective", "kd", "--train", "last-k", "--k", "3", "--lr", "2e-4"],
    "kd/bridge": ["--objective", "kd", "--train", "bridge", "--repair", "bridge", "--lr", "2e-3"],
}
REFERENCE = "lm/LoRA"


#: the configuration of the run the docs quote: the runner (python -m experiments run heal_default_arms) passes each as --key value unless the command line gives it
CONFIG = {
    'n': '4,1',
    'steps': 30,
    'limit': 50,
}


def run_arm(n: int, arm: str, limit: int, steps: int, out: Path) -> dict:
    """One ``swapkl heal`` process; returns its JSON with ``cpu_s`` and ``wall_s`` added."""
    args = [sys.executable, "-m", "swapkl", "heal", "default", "--n", str(n), *COMMON, *ARMS[arm],
            "--limit", str(limit), "--json", str(out)]
    args[args.index("--steps") + 1] = str(steps)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0 or not out.exists():
        raise SystemExit(f"{arm} n={n} failed ({p.returncode}): {p.stderr.strip()[-800:]}")
    d = json.loads(out.read_text())
    d["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    d["wall_s"] = wall
    d["stdout"] = p.stdout[-2000:]
    return d


def _windows(d: dict, text: str) -> dict:
    w = d["windows"] if text == "eval" else d["held_out"]["windows"]
    return {k: np.asarray(v, dtype=np.float64) for k, v in w.items()}


def paired(a: dict, b: dict, text: str = "eval") -> dict:
    """Arm a − arm b on the same windows: recovered share (points; each arm's own control) and healed ΔPPL vs the
    base (points of the base PPL), each with the paired bootstrap 95 % CI."""
    from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, percentile_ci

    wa, wb = _windows(a, text), _windows(b, text)
    counts = wa["counts"].astype(np.int64)
    if not np.array_equal(counts, wb["counts"]) or not np.allclose(wa["base"], wb["base"]):
        raise SystemExit("the two arms were not measured on the same windows")
    idx = np.concatenate([np.arange(len(counts))[None], bootstrap_indices(len(counts), N_BOOT, BOOT_SEED)])
    c = counts[idx].sum(1)

    def ppl(w, role):
        return np.exp(w[role][idx].sum(1) / c)

    def rec(w):
        return 1.0 - (ppl(w, "healed") - ppl(w, "base_finetuned")) / (ppl(w, "pruned") - ppl(w, "base"))

    out = {}
    for key, vals in {"recovered_pts": 100.0 * (rec(wa) - rec(wb)),
                      "healed_delta_pts": 100.0 * (ppl(wa, "healed") - ppl(wb, "healed")) / ppl(wa, "base")}.items():
        lo, hi = percentile_ci(vals[1:])
        out[key] = {"value": float(vals[0]), "ci": [lo, hi],
                    "word": "tie" if lo <= 0 <= hi else ("higher" if lo > 0 else "lower")}
    return out


def _acc(d: dict) -> str:
    """Task accuracy (lm-eval's ``acc``) of the base, the pruned model (and the bridged one after a repair) and the
    healed model, with the healed one's stderr."""
    t = d.get("tasks") or {}
    rows = [e for es in (t.get("methods") or {}).values() for e in es]
    if not rows:
        return "-"

    def acc(part):
        return {task: m.get("acc,none") for task, m in (part or {}).get("metrics", {}).items()}
    out = []
    for task, base in acc(t.get("base")).items():
        pruned, healed = acc(rows[0].get("pruned"))[task], acc(rows[0].get("healed"))[task]
        bridged = f" bridged {acc(rows[0]['bridged'])[task]:.3f}" if rows[0].get("bridged") else ""
        se = rows[0]["healed"]["stderr"][task].get("acc,none")
        out.append(f"{task} acc base {base:.3f} pruned {pruned:.3f}{bridged} healed {healed:.3f} ± {se:.3f}")
    return "; ".join(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="4,1")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    os.environ.setdefault("SWAPKL_CORPUS", str(ROOT / "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"))
    report: dict = {"arms": {k: ARMS[k] for k in a.arms.split(",")}, "common": COMMON, "steps": a.steps,
                    "limit": a.limit, "n": {}}
    tmp = Path(tempfile.mkdtemp(prefix="swapkl-arms-"))
    for n in [int(x) for x in a.n.split(",")]:
        res = {}
        for arm in a.arms.split(","):
            d = run_arm(n, arm, a.limit, a.steps, tmp / f"{n}-{arm.replace('/', '_')}.json")
            res[arm] = d
            rc = d.get("recovered_ci") or [float("nan")] * 2
            hv = d["delta_pct"]["healed_vs_base"]
            ho = d["held_out"]["delta_pct"]["healed_vs_base"]
            print(f"n={n} {arm:<11} removed {d['removed']} trainable {d['training']['healed']['trainable_params']:>9,} "
                  f"recovered {d['recovered']:+.3f} [{rc[0]:+.3f}, {rc[1]:+.3f}]  healed vs base {hv['value']:+.1f} % "
                  f"[{hv['ci'][0]:+.1f}, {hv['ci'][1]:+.1f}]  held-out {ho['value']:+.1f} % [{ho['ci'][0]:+.1f}, "
                  f"{ho['ci'][1]:+.1f}]  task {_acc(d)}  PPL base {d['ppl']['base']:.2f} pruned {d['ppl']['pruned']:.2f} "
                  f"healed {d['ppl']['healed']:.2f} control {d['ppl']['base_finetuned']:.2f}  "
                  f"CPU {d['cpu_s']:.0f} s (wall {d['wall_s']:.0f} s)", flush=True)
        vs = {}
        if REFERENCE in res:
            for arm, d in res.items():
                if arm == REFERENCE:
                    continue
                vs[arm] = {text: paired(d, res[REFERENCE], text) for text in ("eval", "held_out")}
                for text, p in vs[arm].items():
                    r, h = p["recovered_pts"], p["healed_delta_pts"]
                    print(f"    n={n} {arm} − {REFERENCE} ({text}): recovered {r['value']:+.1f} pts "
                          f"[{r['ci'][0]:+.1f}, {r['ci'][1]:+.1f}] {r['word']}; healed ΔPPL {h['value']:+.1f} pts "
                          f"[{h['ci'][0]:+.1f}, {h['ci'][1]:+.1f}] {h['word']}", flush=True)
        report["n"][n] = {"arms": {k: {kk: v for kk, v in d.items() if kk not in ("windows",)} for k, d in res.items()},
                          "vs_reference": vs}
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


if __name__ == "__main__":
    main()
