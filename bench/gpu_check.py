#!/usr/bin/env python3
"""A prepared GPU check of the swap-KL engine at real model shapes (no network, random weights).

    bench/gpu_check.sh            # on a CUDA machine: Pythia-410M and Qwen3-8B shapes, bf16
    bench/gpu_check.sh --small    # tiny shapes on the CPU (float32), < 60 s; what the tests run

Builds random-initialised models from configs written inline (the real shapes of Pythia-410M and Qwen3-8B;
no download), feeds random token ids, and prints one JSON object on stdout:

* ``reference_check`` (per shape): the engine and the plain implementation (:mod:`swapkl.scoring.reference`: a full
  batch-of-one forward per variant with weights copied in) on the *same* few pairs and prompts (listed in
  the output): wall-time ratio ``reference_s / engine_s`` and the largest per-prompt KL difference (nats);
* ``pythia_410m_all_pairs``: both full 24x24 matrices (all 276 pairs, both protocols, both directions) at
  100 prompts x 128 tokens - target under 60 s;
* ``qwen3_8b_gap3``: both protocols on ``|i-j| <= 3`` (102 pairs) at 128 tokens, measured on fewer prompts
  than 500 when the time budget needs it and extrapolated linearly to 500 (every cost of the sweep is
  proportional to the number of prompts; ``extrapolated`` says whether it was) - target under 600 s;
* per run: block FLOPs actually run (``engine.stats.block_calls`` x FLOPs per token of one block x T) over
  the wall time, as a fraction of ``peak_flops`` (989e12 = H200 SXM dense bf16 without sparsity, NVIDIA's
  datasheet figure; ``--peak-tflops`` to change); the output head and KL are not counted, so the fraction
  is a lower bound; peak memory (``torch.cuda.max_memory_allocated``, or the process's max RSS on the CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

H200_PEAK_BF16 = 989e12  # FLOP/s, H200 SXM dense BF16 tensor core (no sparsity)

FULL = {
    "pythia-410m": dict(model_type="gpt_neox", num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                        intermediate_size=4096, vocab_size=50304, rotary_pct=0.25, rotary_emb_base=10000,
                        max_position_embeddings=2048, use_parallel_residual=True, layer_norm_eps=1e-5,
                        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0),
    "qwen3-8b": dict(model_type="qwen3", num_hidden_layers=36, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
                     max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
}
SMALL = {
    "pythia-410m": FULL["pythia-410m"] | dict(num_hidden_layers=6, hidden_size=64, num_attention_heads=4,
                                              intermediate_size=256, vocab_size=512, max_position_embeddings=256),
    "qwen3-8b": FULL["qwen3-8b"] | dict(num_hidden_layers=6, hidden_size=64, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16, intermediate_size=192, vocab_size=1024,
                                        max_position_embeddings=256, bos_token_id=0, eos_token_id=0),
}


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gib(dev: torch.device) -> float:
    if dev.type == "cuda":
        return torch.cuda.max_memory_allocated(dev) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)


def build(cfg_dict: dict, dtype: torch.dtype, dev: torch.device, seed: int = 0):
    """A random-initialised causal LM of the given config, directly on ``dev`` (no CPU copy of the weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(cfg_dict)
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(seed)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def block_flops_per_token(model, T: int) -> float:
    """FLOPs of one block for one token: 2 x its matmul weights, plus causal attention scores and values
    (2 matmuls x 2 FLOP x T/2 average context x heads x head_dim)."""
    from swapkl.model.architectures import locate

    blk = locate(model).blocks[0]
    mm = sum(p.numel() for p in blk.parameters() if p.dim() == 2)
    cfg = model.config
    H = cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    return 2.0 * mm + 2.0 * T * H * hd


def run_sweep(model, ids: torch.Tensor, pairs, peak_flops: float | None) -> dict:
    from swapkl.scoring.score import engine_limits
    from swapkl.scoring.engine import SwapEngine

    dev = next(model.parameters()).device
    P, T = ids.shape
    limits = engine_limits(model, P, T, "all")
    retries = []
    reset_peak(dev)
    sync(dev)
    t0 = time.perf_counter()
    eng = SwapEngine(model, ids, positions="all", on_oom=retries.append, **limits)
    out = eng.sweep(pairs)
    sync(dev)
    secs = time.perf_counter() - t0
    fl = eng.stats.block_calls * block_flops_per_token(model, T) * T
    vals = torch.stack([v for p in out.values() for v in p.values()])
    return {"pairs": len(pairs), "prompts": P, "tokens": T, "seconds": secs,
            "block_calls": eng.stats.block_calls, "naive_block_calls": eng.stats.naive_block_calls,
            "block_tflops_run": fl / 1e12, "achieved_tflops_per_s": fl / secs / 1e12,
            "fraction_of_peak": (fl / secs / peak_flops) if peak_flops else None,
            "peak_memory_gib": peak_gib(dev), "limits": {k: v for k, v in limits.items()},
            "final_max_rows": eng.batch.max_rows, "oom_retries": retries,
            "kl_mean_nats": float(vals.mean()), "kl_max_nats": float(vals.max()),
            "all_finite": bool(torch.isfinite(vals).all())}


def reference_check(model, ids: torch.Tensor, pairs) -> dict:
    """Engine vs the plain implementation on the same inputs (a few pairs, a few prompts)."""
    from swapkl.scoring.engine import noise_floor, SwapEngine
    from swapkl.scoring.reference import reference_sweep

    dev = next(model.parameters()).device
    # warm-up (kernel selection, allocator) so neither side pays it
    SwapEngine(model, ids[:1], positions="all").sweep(pairs[:1])
    sync(dev)
    t0 = time.perf_counter()
    eng = SwapEngine(model, ids, positions="all")
    got = eng.sweep(pairs)
    sync(dev)
    t_eng = time.perf_counter() - t0
    t0 = time.perf_counter()
    ref = reference_sweep(model, ids, pairs, positions="all")
    sync(dev)
    t_ref = time.perf_counter() - t0
    diffs, rels, vals = [], [], []
    for p in pairs:
        for k in ("repl_ij", "repl_ji", "inter"):
            r = ref[p][k].double().cpu()
            g = got[p][k].double().cpu()
            diffs.append((g - r).abs().max().item())
            rels.append(((g - r).abs() / r.abs().clamp_min(1e-12)).max().item())
            vals.append(r.mean().item())
    return {"pairs": [list(p) for p in pairs], "prompts": int(ids.shape[0]), "tokens": int(ids.shape[1]),
            "engine_s": t_eng, "reference_s": t_ref, "speed_ratio": t_ref / t_eng,
            "max_abs_diff_nats": max(diffs), "max_rel_diff": max(rels), "min_kl_nats": min(vals),
            "noise_floor_nats": noise_floor(eng), "note": "engine time includes its baseline pass; "
            "reference = batch-of-one full forwards with load_state_dict weight copies (swapkl.scoring.reference)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (float32), for tests")
    ap.add_argument("--device", default=None, help="default: cuda when available (cpu with --small)")
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                    help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--pythia-prompts", type=int, default=None)
    ap.add_argument("--qwen-prompts", type=int, default=None, help="most prompts actually measured (<= 500)")
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=440.0,
                    help="wall-clock budget; the Qwen3-8B measurement uses as many prompts as fit")
    ap.add_argument("--peak-tflops", type=float, default=None, help="peak dense FLOP/s in TFLOP/s "
                    "(default 989 = H200 bf16 on CUDA; none on the CPU)")
    ap.add_argument("--skip-qwen", action="store_true")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    if a.small:
        torch.set_num_threads(1)  # tiny matrices: threads only add synchronisation (and suffer on a busy CPU)

    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() and not a.small else "cpu"))
    dtype = getattr(torch, a.dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
    cfgs = SMALL if a.small else FULL
    T = a.tokens or (32 if a.small else 128)
    P_pythia = a.pythia_prompts or (8 if a.small else 100)
    P_qwen_target = 40 if a.small else 500
    P_qwen_max = min(a.qwen_prompts or (8 if a.small else 500), P_qwen_target)
    peak = a.peak_tflops * 1e12 if a.peak_tflops else (H200_PEAK_BF16 if dev.type == "cuda" else None)
    gen = torch.Generator().manual_seed(0)
    from swapkl.contract import pair_list

    report = {"small": a.small, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else
              f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
              "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""), "tokens": T,
              "peak_flops": peak, "peak_flops_source": "H200 SXM dense BF16 (NVIDIA datasheet, no sparsity)"
              if peak == H200_PEAK_BF16 else ("--peak-tflops" if peak else None),
              "shapes": {k: {kk: v[kk] for kk in ("model_type", "num_hidden_layers", "hidden_size",
                                                   "num_attention_heads", "intermediate_size", "vocab_size")}
                         for k, v in cfgs.items()}}

    def emit_progress(stage: str) -> None:
        print(f"[gpu_check {time.perf_counter() - t_start:6.1f}s] {stage}", file=sys.stderr, flush=True)

    # ---- Pythia-410M shape: plain-implementation ratio, then both full 24x24 matrices
    emit_progress("building pythia-410m shape")
    model = build(cfgs["pythia-410m"], dtype, dev)
    L = model.config.num_hidden_layers
    V = model.config.vocab_size
    ref_pairs = [(0, 1), (L // 2, L // 2 + 2), (L - 2, L - 1)]
    ids = torch.randint(0, V, (4 if not a.small else 2, T), generator=gen)
    emit_progress("reference check (pythia shape)")
    report["reference_check"] = {"pythia-410m": reference_check(model, ids, ref_pairs)}
    emit_progress("pythia all pairs")
    ids = torch.randint(0, V, (P_pythia, T), generator=gen)
    r = run_sweep(model, ids, pair_list("all", L), peak)
    r |= {"target_s": 60.0, "meets_target": r["seconds"] < 60.0}
    report["pythia_410m_all_pairs"] = r
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    # ---- Qwen3-8B shape: |i-j| <= 3 at 500 x 128 (or fewer prompts, extrapolated)
    if not a.skip_qwen:
        emit_progress("building qwen3-8b shape")
        model = build(cfgs["qwen3-8b"], dtype, dev)
        L = model.config.num_hidden_layers
        V = model.config.vocab_size
        ids = torch.randint(0, V, (2, T), generator=gen)
        emit_progress("reference check (qwen shape)")
        report["reference_check"]["qwen3-8b"] = reference_check(model, ids, [(0, 1), (L // 2 - 1, L // 2 + 2)])
        pairs = pair_list("gap:3", L)
        # a short probe sizes the measured run to the remaining budget
        P_probe = 2 if a.small else 8
        emit_progress(f"qwen probe ({P_probe} prompts)")
        probe = run_sweep(model, torch.randint(0, V, (P_probe, T), generator=gen), pairs, peak)
        left = a.budget_s - (time.perf_counter() - t_start) - 20.0
        P = max(P_probe, min(P_qwen_max, int(left / (probe["seconds"] / P_probe))))
        emit_progress(f"qwen gap:3 on {P} prompts")
        r = run_sweep(model, torch.randint(0, V, (P, T), generator=gen), pairs, peak)
        extrap = r["seconds"] * P_qwen_target / P
        r |= {"measured_prompts": P, "target_prompts": P_qwen_target, "seconds_measured": r["seconds"],
              "seconds_at_target_prompts": extrap, "extrapolated": P != P_qwen_target,
              "extrapolation": (f"linear in prompts from {P} measured prompts to {P_qwen_target}"
                                if P != P_qwen_target else None),
              "probe": {"prompts": P_probe, "seconds": probe["seconds"]},
              "target_s": 600.0, "meets_target": extrap < 600.0}
        report["qwen3_8b_gap3"] = r
        del model
    runs = [report.get("pythia_410m_all_pairs"), report.get("qwen3_8b_gap3")]
    report["peak_memory_gib"] = max(r["peak_memory_gib"] for r in runs if r)
    report["peak_memory_source"] = "torch.cuda.max_memory_allocated" if dev.type == "cuda" else "process max RSS"
    report["total_seconds"] = time.perf_counter() - t_start
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
