#!/usr/bin/env python3
"""The GPU acceptance script: one call of at most 7 minutes on one GPU (issue 29), no network, random weights.

    python3 tests/gpu/gpu_check.py --out $OUT/gpu_check.json      # on a CUDA machine (default budget 390 s)
    python3 tests/gpu/gpu_check.py --smoke --out /tmp/smoke.json   # the same stages on tiny shapes on a CPU (the tests)

Stages, in this order; the JSON (``--out``, else ``$OUT/gpu_check.json``, and stdout at the end) is rewritten after
every stage, so a run cut off still reports what finished; a stage that would not fit the time left is skipped and
says so.  ``table`` lists each stage with pass/fail, seconds, share of the measured peak and peak memory.

* ``env``: versions (python, torch, CUDA, cuDNN, transformers, accelerate, swapkl, the git commit, GPU, driver) and
  the chip's measured ceilings: bf16 GEMM TFLOP/s (8192^3, best of several) and device copy GB/s (1 GiB);
* ``correctness``: the fixed-seed Pythia-shape model of ``tests/gpu/gpu_models.py`` (Pythia-410M's widths on 4
  layers; weights from a hash, the same on every machine) against the float64 result computed on a CPU and
  committed as ``tests/gpu/gpu_check_expected.json``: float32 with TF32 off (fused KL and plain KL) within 1e-4
  relative of every per-prompt KL; bf16 within max(1e-2 x KL, 5 x precision floor) - pass/fail per case;
* ``pythia``: the Pythia-410M shape, all 276 pairs, 100 prompts x 128 tokens, bf16: seconds, FLOPs spent (blocks
  and head, from the engine's counters) over the measured bf16 peak, seconds in head + KL and in the KL alone,
  peak memory against the memory model's estimate; the same with the fused KL off (plain), in the same run;
  targets (reported, not pass/fail): <= 10 s, >= 50 % of the peak, the fused KL >= 2x faster;
* ``oom``: a forced out-of-memory (``torch.cuda.set_per_process_memory_fraction`` just above what is allocated)
  recovered by batch halving, results equal to the unconstrained run (float32, 1e-4 relative);
* ``device_map``: stories260K split over cuda:0 and the CPU (``--device-map``) equal to one device;
* ``torchrun``: ``torchrun --nproc_per_node=2`` on the one GPU (gloo) equal to one process;
* ``scaling``: adjacent / gap:3 pairs at 100 prompts and all pairs at 25 / 50 prompts (with ``pythia``'s all pairs
  at 100): seconds against predicted FLOPs (a linear fit), predicted block runs equal to those run;
* ``study``: ``swapkl study`` on this device (stories260K's row equal to the CPU's), then ``--preset paper`` on
  every paper model in the local hub cache within the budget, each figure beside the paper's;
* ``qwen``: the Qwen3-8B shape, gap:3, the real 500 x 128 tokens, bf16: peak memory and seconds measured on the first
  16 pairs (fewer if the budget ends first: ``measured_pairs``), extrapolated to all 102 with the block-run count.

``--smoke`` runs every stage on tiny shapes on the CPU (the OOM is then simulated with the engine's fault hook, the
device map is all-CPU, torchrun uses the CPU); it checks the script, not the chip.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run by path (the device machine): the checkout's swapkl; gpu_models sits beside
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
STORIES = ROOT / "tests" / "fixtures" / "models" / "stories260K"
os.environ.setdefault("SWAPKL_CORPUS", str(ROOT / "tests" / "fixtures" / "data" / "wikitext-2-raw" / "wiki.test.raw"))
os.environ.setdefault("SWAPKL_CACHE", tempfile.mkdtemp(prefix="swapkl-gpu-check-"))  # nothing left in the checkout

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpu_models as gm  # noqa: E402
from swapkl.contract import Contract, pair_list  # noqa: E402
from swapkl.errors import ComputeInterrupted  # noqa: E402
from swapkl.scoring.engine import SwapEngine, precision_floor  # noqa: E402
from swapkl.scoring.memory import engine_limits, measured_peak, memory_estimate  # noqa: E402
from swapkl.scoring.results import finite_json  # noqa: E402
from swapkl.store import atomic_write_text  # noqa: E402

GIB = 2**30
#: seconds a stage needs at least to start (full run, smoke run)
MIN_S = {"env": (5, 1), "correctness": (30, 5), "pythia": (45, 5), "oom": (15, 3), "device_map": (10, 3),
         "torchrun": (45, 10), "scaling": (20, 3), "qwen": (60, 5), "study": (40, 10)}


class Run:
    """The report, the clock and the output file of one call."""

    def __init__(self, out: Path | None, budget_s: float, smoke: bool, device: torch.device):
        self.t0, self.budget, self.smoke, self.dev, self.out = time.perf_counter(), budget_s, smoke, device, out
        self.peak_flops = None  # measured bf16 GEMM FLOP/s (env stage)
        self.keep: dict = {}    # what a later stage reuses (the Pythia-shape model)
        self.report = {"format": "swapkl.gpu_check/1", "smoke": smoke, "device": str(device),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "budget_s": budget_s, "stages": {},
                       "table": [], "complete": False}

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[gpu_check {time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def stage(self, name: str, fn) -> None:
        need = MIN_S[name][1 if self.smoke else 0]
        if self.left() < need:
            res = {"pass": None, "skipped": f"{self.left():.0f} s left, the stage needs at least {need} s"}
        else:
            self.log(f"stage {name}")
            if self.dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.dev)
            t = time.perf_counter()
            try:
                res = fn(self)
            except Exception as e:
                res = {"pass": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500],
                       "traceback": traceback.format_exc()[-3000:]}
            res["seconds"] = time.perf_counter() - t
            res.setdefault("peak_memory_gib", self.stage_peak_gib())
            gc.collect()
            if self.dev.type == "cuda":
                torch.cuda.empty_cache()
        self.report["stages"][name] = res
        self.write()

    def stage_peak_gib(self) -> float:
        if self.dev.type == "cuda":
            return torch.cuda.max_memory_allocated(self.dev) / GIB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # the process's max RSS (KiB -> GiB)

    def write(self, final: bool = False) -> None:
        st = self.report["stages"]
        self.report["table"] = [{"stage": k, "pass": v.get("pass"), "seconds": v.get("seconds"),
                                 "share_of_peak": v.get("share_of_peak"), "peak_memory_gib": v.get("peak_memory_gib"),
                                 "note": v.get("skipped") or v.get("error") or v.get("note")} for k, v in st.items()]
        self.report["elapsed_s"] = time.perf_counter() - self.t0
        self.report["complete"] = final
        ran = [v["pass"] for v in st.values() if v.get("pass") is not None]
        self.report["all_pass"] = bool(ran) and all(ran) and not any(v.get("skipped") for v in st.values())
        text = json.dumps(finite_json(self.report), indent=1, allow_nan=False)
        if self.out is not None:
            atomic_write_text(self.out, text)
        if final:
            print(text)


def _peak_gib(peak_bytes: int) -> float:
    return peak_bytes / GIB


def _tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def _timed(run: Run, fn):
    run.sync()
    t = time.perf_counter()
    out = fn()
    run.sync()
    return out, time.perf_counter() - t


# ----------------------------------------------------------------------------------------------------------- env
def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _driver() -> str | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def stage_env(run: Run) -> dict:
    import transformers

    import swapkl

    try:
        import accelerate
        acc = accelerate.__version__
    except ImportError:
        acc = None
    dev = run.dev
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
            "transformers": transformers.__version__, "accelerate": acc, "swapkl": swapkl.__version__,
            "git_commit": _git_commit(), "cpu_count": os.cpu_count(), "platform": platform.platform()}
    if dev.type == "cuda":
        prop = torch.cuda.get_device_properties(dev)
        info |= {"gpu": prop.name, "gpu_memory_gib": prop.total_memory / GIB, "driver": _driver(),
                 "capability": f"{prop.major}.{prop.minor}"}
    n = 256 if run.smoke else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = math.inf
    for _ in range(5):
        _, t = _timed(run, lambda: [a @ b for _ in range(10)])
        best = min(best, t / 10)
    gemm = 2.0 * n**3 / best
    nbytes = (16 * 2**20) if run.smoke else GIB
    src = torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(5):
        _, t = _timed(run, lambda: [dst.copy_(src) for _ in range(5)])
        best = min(best, t / 5)
    run.peak_flops = gemm
    info |= {"bf16_gemm_tflops": gemm / 1e12, "bf16_gemm_shape": [n, n, n], "copy_gb_per_s": 2 * nbytes / best / 1e9,
             "copy_bytes": nbytes, "note": "ceilings measured on this chip in this call; 'share_of_peak' divides by "
             "bf16_gemm_tflops"}
    return {"pass": True, **info}


# --------------------------------------------------------------------------------------------------- correctness
def _compare(got: dict, expected: dict, tol_fn) -> dict:
    worst_rel = worst_abs = 0.0
    fails = []
    smallest = math.inf
    for key, vecs in expected.items():
        i, j = (int(x) for x in key.split("-"))
        for k, exp in vecs.items():
            e = np.asarray(exp, dtype=float)
            g = np.asarray(got[(i, j)][k], dtype=float)
            d = np.abs(g - e)
            worst_abs = max(worst_abs, float(d.max()))
            worst_rel = max(worst_rel, float((d / np.maximum(np.abs(e), 1e-12)).max()))
            smallest = min(smallest, float(e.min()))
            bad = d > tol_fn(e)
            if bad.any():
                fails.append(f"{k} ({i},{j}) prompt {int(np.argmax(bad))}: {g[bad][0]:.6g} vs {e[bad][0]:.6g}")
    return {"max_rel_diff": worst_rel, "max_abs_diff_nats": worst_abs, "smallest_expected_kl": smallest,
            "pass": not fails, "failures": fails[:5]}


def stage_correctness(run: Run) -> dict:
    name = "smoke" if run.smoke else "full"
    exp = json.loads(gm.EXPECTED.read_text())[name]
    c = gm.CORRECTNESS[name]
    if exp["config"] != c["config"] or exp["seed"] != c["seed"]:
        return {"pass": False, "error": f"{gm.EXPECTED.name} was made for another case; rerun gpu_models.py "
                "--make-expected"}
    model64 = gm.build(c["config"], torch.float64, "cpu", seed=c["seed"])
    same_weights = abs(model64.weights_checksum - exp["weights_checksum"]) <= 1e-9 * exp["weights_checksum"]
    ids = gm.det_ids(c["prompts"], c["tokens"], c["config"]["vocab_size"], c["seed"])
    pairs = [tuple(p) for p in exp["pairs"]]
    cases = {}
    _tf32(False)
    for case, dtype, impl in (("float32, fused KL", torch.float32, "auto"), ("float32, plain KL", torch.float32,
                                                                               "plain"),
                              ("bfloat16, fused KL", torch.bfloat16, "auto")):
        model = copy.deepcopy(model64).to(device=run.dev, dtype=dtype)
        eng = SwapEngine(model, ids, kl_impl=impl)
        got = eng.sweep(pairs)
        if dtype == torch.float32:
            res = _compare(got, exp["kl"], lambda e: 1e-4 * np.abs(e))
            res["criterion"] = "|KL - KL_fp64| <= 1e-4 x KL_fp64, every pair, variant and prompt"
        else:
            floor = precision_floor(eng, n=c["prompts"])
            res = _compare(got, exp["kl"], lambda e, f=floor: np.maximum(1e-2 * np.abs(e), 5 * f))
            res |= {"precision_floor_nats": floor,
                    "criterion": "|KL - KL_fp64| <= max(1e-2 x KL_fp64, 5 x precision floor)"}
        res["kl"] = dict(eng.head.kl.record)
        cases[case] = res
        del model, eng
    _tf32(True)
    ok = same_weights and all(r["pass"] for r in cases.values())
    return {"pass": ok, "weights_reproduced": same_weights, "cases": cases, "pairs": [list(p) for p in pairs],
            "prompts": c["prompts"], "tokens": c["tokens"], "shape": {k: c["config"][k] for k in (
                "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")},
            "expected": f"tests/gpu/{gm.EXPECTED.name}[{name}] ({exp['how']}, torch {exp['torch']})"}


# -------------------------------------------------------------------------------------------------------- pythia
def _sweep_run(run: Run, model, ids, pairs, impl: str, timing: bool = True, limits: dict | None = None) -> dict:
    """One timed engine run (baseline + sweep) with its FLOPs, peak memory and the memory model's estimate."""
    P, T = ids.shape
    limits = limits or engine_limits(model, P, T)
    holder = {}

    def go():
        eng = SwapEngine(model, ids, kl_impl=impl, timing=timing, **limits)
        holder["out"] = eng.sweep(pairs)
        run.sync()
        return eng

    t = time.perf_counter()
    eng, peak = measured_peak(go, run.dev)
    secs = time.perf_counter() - t
    st = eng.stats
    bflops = (st.baseline_block_calls + st.block_calls) * gm.block_flops_per_token(model, T) * T
    hflops = st.head_positions * gm.head_flops_per_position(model)
    est = memory_estimate(model, P, T, limits, num_pairs=len(pairs))
    share = (bflops + hflops) / secs / run.peak_flops if run.peak_flops else None
    return {"pairs": len(pairs), "prompts": P, "tokens": T, "seconds": secs, "kl": dict(eng.head.kl.record),
            "block_runs": st.baseline_block_calls + st.block_calls, "head_positions": st.head_positions,
            "tflop_blocks": bflops / 1e12, "tflop_head": hflops / 1e12, "achieved_tflops": (bflops + hflops) / secs / 1e12,
            "share_of_peak": share, "head_kl_seconds": st.head_kl_seconds if timing else None,
            "kl_seconds": st.kl_seconds if timing else None, "peak_memory_gib": _peak_gib(peak),
            "estimated_memory_gib": est["total"] / GIB, "estimate_bounds_peak": peak <= est["total"],
            "limits": limits, "oom_retries": list(st.oom_retries), "vectors": holder["out"]}


def _max_rel(a: dict, b: dict) -> float:
    """The largest relative difference of two sweeps' per-prompt KLs, with float32 rounding of the KL's sum over
    the vocabulary (2e-6 nats) forgiven: max over values of ``max(0, |a - b| - 2e-6) / |b|``."""
    return max(float(((x[k].double() - y[k].double()).abs() - 2e-6).clamp_min(0).div(
        y[k].double().abs().clamp_min(1e-12)).max()) for p in b for x, y in [(a[p], b[p])] for k in y)


def stage_pythia(run: Run) -> dict:
    cfg = gm.TINY["pythia"] if run.smoke else gm.PYTHIA_410M
    P, T = (8, 32) if run.smoke else (100, 128)
    dtype = torch.bfloat16
    model = gm.build(cfg, dtype, run.dev)
    L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
    ids = gm.det_ids(P, T, V, 1)
    pairs = pair_list("all", L)
    (_, warm) = _timed(run, lambda: SwapEngine(model, ids[:4], kl_impl="auto").sweep(pairs[:2]))
    fused = _sweep_run(run, model, ids, pairs, "auto")
    plain = _sweep_run(run, model, ids, pairs, "plain")
    rel = _max_rel(fused.pop("vectors"), plain["vectors"])
    run.keep["pythia"] = (model, ids, plain.pop("vectors"), fused)
    ratio_kl = plain["kl_seconds"] / fused["kl_seconds"] if fused["kl_seconds"] else None
    ok = rel <= 1e-4 and fused["estimate_bounds_peak"] and plain["estimate_bounds_peak"]
    return {"pass": ok, "shape": {k: cfg[k] for k in ("model_type", "num_hidden_layers", "hidden_size",
                                                     "intermediate_size", "vocab_size")},
            "dtype": "bfloat16", "warmup_s": warm, "fused": fused, "unfused": plain,
            "fused_vs_unfused_max_rel_diff": rel, "kl_speedup": ratio_kl,
            "head_kl_speedup": plain["head_kl_seconds"] / fused["head_kl_seconds"] if fused["head_kl_seconds"] else None,
            "total_speedup": plain["seconds"] / fused["seconds"],
            "share_of_peak": fused["share_of_peak"], "peak_memory_gib": fused["peak_memory_gib"],
            "targets": {"seconds<=10": fused["seconds"] <= 10.0,
                        "share_of_peak>=0.5": (fused["share_of_peak"] or 0) >= 0.5,
                        "kl_speedup>=2": (ratio_kl or 0) >= 2.0},
            "note": "pass = fused and plain KL agree to 1e-4 relative (beyond 2e-6 nats of float32 rounding) and "
                    "the memory estimate bounds both peaks; the targets are reported, not required"}


# ---------------------------------------------------------------------------------------------------- scaling
def stage_scaling(run: Run) -> dict:
    if "pythia" not in run.keep:
        return {"pass": None, "skipped": "needs the pythia stage's model"}
    model, ids, _, fused = run.keep["pythia"]
    P, T = ids.shape
    L = model.config.num_hidden_layers
    points = []
    for spec, n in (("adjacent", P), ("gap:3", P), ("all", P // 4), ("all", P // 2), ("all", P)):
        pairs = pair_list(spec, L)
        limits = engine_limits(model, n, T)
        pred = gm.predicted_flops(model, pairs, n, T, limits)
        if spec == "all" and n == P:
            r = fused
        else:
            r = _sweep_run(run, model, ids[:n], pairs, "auto", timing=False, limits=limits)
            r.pop("vectors")
        points.append({"pairs": spec, "npairs": len(pairs), "prompts": n, "seconds": r["seconds"],
                       "predicted_tflop": pred["flops"] / 1e12, "predicted_block_runs": pred["block_runs"],
                       "block_runs": r["block_runs"], "share_of_peak": r["share_of_peak"]})
    x = np.array([p["predicted_tflop"] for p in points])
    y = np.array([p["seconds"] for p in points])
    slope, icpt = np.polyfit(x, y, 1)
    fit = slope * x + icpt
    r2 = 1 - float(((y - fit) ** 2).sum()) / max(1e-12, float(((y - y.mean()) ** 2).sum()))
    exact = all(p["predicted_block_runs"] == p["block_runs"] for p in points)
    return {"pass": exact, "points": points, "fit": {"seconds_per_tflop": slope, "intercept_s": icpt, "r2": r2},
            "note": "pass = the predicted block runs are those the engine ran; the fit says how well predicted FLOPs "
                    "explain the time"}


# ------------------------------------------------------------------------------------------------------- qwen
def stage_qwen(run: Run) -> dict:
    run.keep.clear()
    gc.collect()
    if run.dev.type == "cuda":
        torch.cuda.empty_cache()
    cfg = gm.TINY["qwen"] if run.smoke else gm.QWEN3_8B
    P, T, first = (40, 32, 4) if run.smoke else (500, 128, 16)
    model = gm.build(cfg, torch.bfloat16, run.dev)
    L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
    ids = gm.det_ids(P, T, V, 2)
    everything = pair_list("gap:3", L)
    pairs = everything[:first]
    limits = engine_limits(model, P, T)
    deadline = run.t0 + run.budget - 5
    done, times = {}, {}

    def go():
        t = time.perf_counter()
        eng = SwapEngine(model, ids, kl_impl="auto", **limits)
        run.sync()
        times["baseline"] = time.perf_counter() - t
        try:
            eng.sweep(pairs, on_pair=lambda i, j, v: done.__setitem__((i, j), v),
                      should_stop=lambda: time.perf_counter() > deadline)
        except ComputeInterrupted:
            pass
        run.sync()
        times["sweep"] = time.perf_counter() - t - times["baseline"]
        return eng

    eng, peak = measured_peak(go, run.dev)
    measured = [p for p in pairs if p in done]
    if not measured:
        return {"pass": False, "error": "no pair finished within the budget", "peak_memory_gib": _peak_gib(peak)}
    runs_measured = gm.predicted_block_runs(measured, L, P)
    runs_all = gm.predicted_block_runs(everything, L, P)
    extrapolated = times["baseline"] + times["sweep"] * runs_all / runs_measured
    fl_m = gm.predicted_flops(model, measured, P, T, limits)
    fl_all = gm.predicted_flops(model, everything, P, T, limits)
    measured_s = times["baseline"] + times["sweep"]
    by_flops = measured_s * fl_all["flops"] / fl_m["flops"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    total = torch.cuda.get_device_properties(run.dev).total_memory if run.dev.type == "cuda" else None
    est = memory_estimate(model, P, T, limits, num_pairs=len(measured))
    st = eng.stats
    spent = ((st.baseline_block_calls + st.block_calls) * gm.block_flops_per_token(model, T) * T
             + st.head_positions * gm.head_flops_per_position(model))
    share = spent / measured_s / run.peak_flops if run.peak_flops else None
    fits = total is None or weights + peak <= total
    return {"pass": bool(fits and peak <= est["total"]), "prompts": P, "tokens": T, "pairs_total": len(everything),
            "measured_pairs": len(measured), "baseline_s": times["baseline"], "sweep_s": times["sweep"],
            "seconds_measured": measured_s, "block_runs_measured": runs_measured,
            "block_runs_all": runs_all, "seconds_all_extrapolated": extrapolated,
            "seconds_all_by_predicted_flops": by_flops, "share_of_peak": share,
            "peak_memory_gib": _peak_gib(peak), "weights_gib": weights / GIB,
            "estimated_memory_gib": est["total"] / GIB, "device_memory_gib": total / GIB if total else None,
            "limits": limits, "oom_retries": list(eng.stats.oom_retries), "kl": dict(eng.head.kl.record),
            "targets": {"seconds_all<=300": extrapolated <= 300.0, "fits_memory": fits},
            "note": "time extrapolated from the measured pairs with the block-run count (the baseline pass once); "
                    "memory measured at the real prompt count; pass = fits the card and the estimate bounds the peak"}


# --------------------------------------------------------------------------------------------------------- oom
def stage_oom(run: Run) -> dict:
    c = gm.CORRECTNESS["smoke" if run.smoke else "full"]
    P, T = (8, 32) if run.smoke else (32, 128)
    _tf32(False)
    model = gm.build(c["config"], torch.float32, run.dev, seed=c["seed"])
    ids = gm.det_ids(P, T, c["config"]["vocab_size"], 3)
    pairs = pair_list("all", c["config"]["num_hidden_layers"])
    clean = _sweep_run(run, model, ids, pairs, "auto", timing=False)
    big = {"max_rows": 4096, "max_live": 768, "kl_chunk_rows": P, "logp_budget": 0}
    attempts = []
    for frac in ((0.25, 0.1, 0.04) if not run.smoke else (None,)):
        retries = []
        if run.smoke:  # no allocator to cap on a CPU: the engine's fault hook raises what CUDA would
            state = {"n": 0}

            def fault(rows, where, state=state):
                if where != "baseline" and rows > 1 and state["n"] < 4:
                    state["n"] += 1
                    raise torch.OutOfMemoryError(f"CUDA out of memory (simulated, {rows} rows in {where})")
            eng = SwapEngine(model, ids, on_oom=retries.append, fault=fault, **big)
            got = eng.sweep(pairs)
            cap = None
        else:
            eng = SwapEngine(model, ids, on_oom=retries.append, **big)
            torch.cuda.synchronize(run.dev)
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(run.dev).total_memory
            cap = torch.cuda.memory_reserved(run.dev) + max(256 * 2**20, int(clean["peak_memory_gib"] * GIB * frac))
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), run.dev)
            try:
                got = eng.sweep(pairs)
            finally:
                torch.cuda.set_per_process_memory_fraction(1.0, run.dev)
                torch.cuda.empty_cache()
        rel = _max_rel(got, clean["vectors"])
        attempts.append({"cap_gib": cap / GIB if cap else None, "retries": retries, "max_rel_diff": rel})
        if retries:
            break
    _tf32(True)
    last = attempts[-1]
    return {"pass": bool(last["retries"]) and last["max_rel_diff"] <= 1e-4, "simulated": run.smoke,
            "attempts": attempts, "clean_peak_memory_gib": clean["peak_memory_gib"], "prompts": P, "tokens": T,
            "note": "float32, TF32 off; pass = at least one halving and every KL within 1e-4 relative of the "
                    "unconstrained run" + (" (simulated OOM: no GPU)" if run.smoke else "")}


# --------------------------------------------------------------------------------------------- device map, torchrun
CHECK = Contract(pairs="all", prompts=8, tokens=32)


def _result_diff(a, b) -> float:
    return float(max(np.nanmax(np.abs(a.replacement_directed() - b.replacement_directed())),
                     np.nanmax(np.abs(a.interchange() - b.interchange()))))


def stage_device_map(run: Run) -> dict:
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.score import score

    gpu = 0 if run.dev.type == "cuda" else "cpu"
    dm = {"model.embed_tokens": gpu, "model.rotary_emb": gpu, "model.norm": "cpu", "lm_head": "cpu"}
    dm |= {f"model.layers.{k}": (gpu if k < 3 else "cpu") for k in range(5)}
    one = score(load_checkpoint(str(STORIES), device=str(run.dev)), CHECK, use_cache=False)
    ck = load_checkpoint(str(STORIES), device=str(run.dev), device_map=dm)
    devices = [str(next(b.parameters()).device) for b in ck.model.model.layers]
    split = score(ck, CHECK, use_cache=False)
    diff = _result_diff(split, one)
    spread = run.smoke or ({d.split(":")[0] for d in devices} == {"cuda", "cpu"})
    return {"pass": diff <= 1e-5 and spread, "max_abs_diff_nats": diff, "layer_devices": devices,
            "device_map": {k: str(v) for k, v in dm.items()}, "smallest_kl": float(np.nanmin(one.interchange())),
            "note": "stories260K, float32, all pairs, 8 x 32; pass = within 1e-5 nats of one device"}


def stage_torchrun(run: Run) -> dict:
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.results import SwapResult
    from swapkl.scoring.score import score

    dev = "cuda:0" if run.dev.type == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "merged.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT), SWAPKL_KL="plain", SWAPKL_CACHE=str(Path(tmp) / "cache"))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "swapkl.commands.distributed", str(STORIES), "--pairs", "all", "--prompts", str(CHECK.prompts),
               "--tokens", str(CHECK.tokens), "--device", dev, "--json", str(out), "--quiet"]
        timeout = max(10.0, min(240.0, run.left() - 5))
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"pass": False, "error": f"torchrun did not finish in {timeout:.0f} s"}
        if p.returncode != 0:
            return {"pass": False, "error": f"torchrun exited {p.returncode}", "stderr": p.stderr[-2000:]}
        merged = SwapResult.load(out)
    one = score(load_checkpoint(str(STORIES), device=dev), CHECK, use_cache=False, engine_kw={"kl_impl": "plain"})
    diff = _result_diff(merged, one)
    d = merged.meta["distributed"]
    return {"pass": diff <= 1e-5 and d["world"] == 2, "max_abs_diff_nats": diff, "world": d["world"],
            "ranks": [{k: r[k] for k in ("rank", "device", "seconds")} | {"pairs": len(r["computed"])}
                      for r in d["ranks"]], "device": dev,
            "note": "two gloo ranks on one device, each its own cache, pairs sent to rank 0 over the process group; "
                    "stories260K float32 all pairs 8 x 32; pass = within 1e-5 nats of one process"}


def _paper_cached() -> list:
    """The ``--preset paper`` models whose config is in the local hub cache (this script never downloads)."""
    from huggingface_hub import try_to_load_from_cache

    from swapkl.study.presets import preset_models

    return [m for m in preset_models("paper") if isinstance(try_to_load_from_cache(m.spec, "config.json"), str)]


def stage_study(run: Run) -> dict:
    """``swapkl study`` on this device: stories260K's row (removal ΔPPL per n, I/R, the verdict) equal to the same
    study on the CPU; then ``--preset paper`` (the paper's contract) on every paper model in the local hub cache, as
    far as the budget allows, each figure beside the paper's (:func:`swapkl.study.presets.against_paper`)."""
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.measure.evaluate import Evaluator
    from swapkl.scoring.corpora import load_corpus
    from swapkl.study.plan import StudyModel, StudyPlan
    from swapkl.study.presets import PAPER_CONTRACT, against_paper
    from swapkl.study.run import run_study

    ev = {"name": "matched@600w", "max_words": 600, "window": 512, "stride": 256, "drop_first_target": False}
    rows = {}
    for dev in dict.fromkeys([str(run.dev), "cpu"]):
        plan = StudyPlan(contract=Contract(prompts=4, tokens=32, device=dev), evaluator=ev, budget=2, n_boot=100,
                         evidence=False, models=(StudyModel(str(STORIES), None, "stories260K"),))
        res = run_study(plan, Evaluator.from_dict(ev), load_corpus(), lambda m, d=dev: load_checkpoint(m.spec, device=d))
        rows[dev] = res.rows[0]
    here, cpu = rows[str(run.dev)], rows["cpu"]
    diffs = [abs(a[p]["delta_pct"] - b[p]["delta_pct"]) / max(abs(b[p]["delta_pct"]), 1e-9)
             for a, b in zip(here["removal"]["rows"], cpu["removal"]["rows"]) for p in ("replacement", "interchange")]
    out = {"pass": here["status"] == "done" and max(diffs) <= 1e-3 and here["verdict"]["regime"] ==
           cpu["verdict"]["regime"], "stories_max_rel_diff_vs_cpu": max(diffs), "stories_rows": here["removal"]["rows"],
           "note": "stories260K, 4 x 32 adjacent, 600 held-out words, n = 1..2: this device against the CPU "
                   "(pass = ΔPPL within 1e-3 relative, same verdict); then the paper preset on cached models"}
    cached = [] if run.smoke else _paper_cached()
    out["paper_models_cached"] = [m.label for m in cached]
    if cached and run.left() > 60:
        from swapkl.measure.evaluate import get_evaluator

        sc, pev = PAPER_CONTRACT["scoring"], get_evaluator(PAPER_CONTRACT["evaluator"])
        plan = StudyPlan(contract=Contract(**sc, device=str(run.dev)), evaluator=pev.to_dict(),
                         budget=PAPER_CONTRACT["budget"], methods=PAPER_CONTRACT["methods"],
                         n_boot=PAPER_CONTRACT["n_boot"], models=tuple(cached))
        deadline = time.perf_counter() + run.left() - 30

        def stop():
            return time.perf_counter() > deadline

        try:
            res = run_study(plan, pev, load_corpus(),
                            lambda m: load_checkpoint(m.spec, dtype=sc["dtype"], device=str(run.dev)),
                            should_stop=stop)
        except ComputeInterrupted:
            res = None
            out["paper_note"] = "the budget ended during the paper preset; finished models are in the study cache"
        if res is not None:
            out["paper_vs_here"] = against_paper(res)
            out["paper_table"] = [{"model": r["model"]["label"], "status": r["status"]} for r in res.rows]
    return out


STAGES = {"env": stage_env, "correctness": stage_correctness, "pythia": stage_pythia, "oom": stage_oom,
          "device_map": stage_device_map, "torchrun": stage_torchrun, "scaling": stage_scaling, "qwen": stage_qwen,
          "study": stage_study}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script, not a chip)")
    ap.add_argument("--device", default=None, help="default: cuda when available (cpu with --smoke)")
    ap.add_argument("--out", default=None, help="the JSON, rewritten after every stage (default $OUT/gpu_check.json)")
    ap.add_argument("--budget-s", type=float, default=390.0, help="wall-clock budget of the whole call")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset, in the fixed order")
    a = ap.parse_args(argv)
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() and not a.smoke else "cpu"))
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    elif not a.smoke:
        print("error: no CUDA device; run with --smoke for the CPU (tiny shapes)", file=sys.stderr)
        return 2
    if a.smoke:
        torch.set_num_threads(1)  # tiny matrices: threads only add synchronisation on a busy CPU
    out = Path(a.out) if a.out else (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    wanted = [s.strip() for s in a.stages.split(",") if s.strip()]
    bad = [s for s in wanted if s not in STAGES]
    if bad:
        print(f"error: unknown stage(s) {', '.join(bad)}; stages: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    run = Run(out, a.budget_s, a.smoke, dev)
    for name, fn in STAGES.items():
        if name in wanted:
            run.stage(name, fn)
    run.write(final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
