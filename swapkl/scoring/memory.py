"""How much memory a sweep holds: the engine's sizes from a memory budget (:func:`engine_limits`), the peak those
sizes predict (:func:`memory_estimate`), and the measured peak to hold the prediction against
(:func:`measured_peak`: ``torch.cuda.max_memory_allocated`` on a GPU, the CPU allocator's own accounting through
the profiler on a CPU).

The memory model, in bytes (P prompts, T tokens, Ts scored positions per prompt, D hidden, I intermediate, H heads,
L layers, V vocabulary, e the model's element size, k the KL's (4: float32)), phase by phase of the engine:

* baseline states ``(L + 1) * P * T * D * e``, held for the whole sweep (the baseline pass joins them one slot at
  a time, so never twice over);
* cached baseline ``p`` and ``log p``, ``2 * P * Ts * V * k``, when that fits ``logp_budget`` (filled chunk by
  chunk into tensors made once);
* live variant row sets, ``P * T * D * e`` each, **four** times over at a block call: every live set's current
  output, the concatenated input of the call, the per-row-chunk outputs and their concatenation;
* one block call's activations, ``max_rows * T * (4 D + 2 I + 2 H T) * max(e, 4)``;
* one KL chunk, ``kl_chunk_rows * Ts * V * 18`` for bf16 logits (:func:`~swapkl.scoring.kl.kl_bytes_per_element`:
  base ``p`` and ``log p``, the logits, their float32 copy and ``log q``).

The estimate adds all of them (the phases do not all overlap, so it is an upper bound); :func:`engine_limits`
gives the live sets half of what the states leave, the block calls 30 %, the KL chunk 10 % and the cached
baseline 10 %.
"""
from __future__ import annotations

import torch

from swapkl.model.architectures import locate
from swapkl.scoring.kl import kl_bytes_per_element

#: activations budget on a CPU (there is no free-memory figure to read)
CPU_BUDGET = 4 * 2**30
#: live row sets held per live variant at a block call (see the module docstring)
LIVE_COPIES = 4


def _shape(model: torch.nn.Module) -> dict:
    cfg = model.config
    D = int(getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 1024))
    H = int(getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", 16))
    inter = int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * D)
    head = locate(model).head
    w = getattr(head, "weight", None)
    V = int(w.shape[0]) if w is not None else int(getattr(cfg, "vocab_size", 50000))
    return {"D": D, "H": H, "I": inter, "V": V, "L": locate(model).num_layers,
            "e": next(model.parameters()).element_size()}


def _model_of(checkpoint) -> torch.nn.Module:
    return checkpoint if isinstance(checkpoint, torch.nn.Module) else checkpoint.model


def available_bytes(model: torch.nn.Module) -> int:
    """Memory the sweep may use: 85 % of the least free CUDA device holding the model, else :data:`CPU_BUDGET`."""
    cuda = sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=str)
    if cuda:
        return int(min(torch.cuda.mem_get_info(d)[0] for d in cuda) * 0.85)
    return CPU_BUDGET


def engine_limits(checkpoint, num_prompts: int, num_tokens: int, positions: str = "all",
                  avail: int | None = None, kl_bytes: int = 4) -> dict:
    """Engine sizes for ``num_prompts`` x ``num_tokens`` from ``avail`` bytes (default :func:`available_bytes`).
    ``checkpoint`` is a :class:`Checkpoint` or a bare model.  Returns ``max_rows``, ``max_live``,
    ``kl_chunk_rows``, ``logp_budget`` (the module docstring gives the model)."""
    model = _model_of(checkpoint)
    s = _shape(model)
    D, H, inter, V, L, e = s["D"], s["H"], s["I"], s["V"], s["L"], s["e"]
    avail = available_bytes(model) if avail is None else int(avail)
    P, T = num_prompts, num_tokens
    Ts = T if positions == "all" else 1
    states = (L + 1) * P * T * D * e
    rest = max(avail - states, avail // 10)
    per_row = T * (4 * D + 2 * inter + 2 * H * T) * max(e, 4)
    max_rows = max(1, min(4096, int(rest * 0.3) // max(1, per_row)))
    per_live = LIVE_COPIES * P * T * D * e
    max_live = max(3, min(3 * 256, int(rest * 0.5) // max(1, per_live)))
    per_kl_row = kl_bytes_per_element(e, kl_bytes) * Ts * V
    kl_chunk_rows = max(1, min(P, int(rest * 0.1) // max(1, per_kl_row)))
    logp_budget = int(rest * 0.1)
    return {"max_rows": int(max_rows), "max_live": int(max_live), "kl_chunk_rows": int(kl_chunk_rows),
            "logp_budget": int(logp_budget)}


def memory_estimate(checkpoint, num_prompts: int, num_tokens: int, limits: dict, positions: str = "all",
                    num_pairs: int | None = None, kl_bytes: int = 4) -> dict:
    """The peak bytes a sweep with ``limits`` (:func:`engine_limits`' keys) holds beyond the weights, by part
    (``states``, ``base_cache``, ``live``, ``block``, ``kl``) and in ``total``.  ``num_pairs`` caps the live
    sets at what that many pairs can have (three variants each)."""
    model = _model_of(checkpoint)
    s = _shape(model)
    D, H, inter, V, L, e = s["D"], s["H"], s["I"], s["V"], s["L"], s["e"]
    P, T = num_prompts, num_tokens
    Ts = T if positions == "all" else 1
    live = max(3, int(limits["max_live"])) // 3 * 3
    if num_pairs is not None:
        live = min(live, 3 * num_pairs)
    rows = min(int(limits["max_rows"]), P * live) if live else int(limits["max_rows"])
    cache = 2 * P * Ts * V * kl_bytes
    cached = cache <= int(limits.get("logp_budget", 0))
    parts = {
        "states": (L + 1) * P * T * D * e,
        "base_cache": cache if cached else 0,
        "live": LIVE_COPIES * live * P * T * D * e,
        "block": rows * T * (4 * D + 2 * inter + 2 * H * T) * max(e, 4),
        "kl": min(P, int(limits["kl_chunk_rows"])) * Ts * V * kl_bytes_per_element(e, kl_bytes),
    }
    parts["total"] = sum(parts.values())
    return parts


def measured_peak(fn, device: torch.device | str = "cpu"):
    """``(fn(), peak)``: the most bytes allocated at once while ``fn`` ran, above what was allocated when it
    started.  CUDA: ``torch.cuda.max_memory_allocated``; CPU: the CPU allocator's allocation events recorded by
    the profiler (every tensor and every operator's scratch buffer, as ``max_memory_allocated`` counts them)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        out = fn()
        torch.cuda.synchronize(dev)
        return out, int(torch.cuda.max_memory_allocated(dev) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = []

    def walk(nodes):
        for n in nodes:
            if n.tag == torch._C._profiler._EventType.Allocation:
                events.append((n.start_time_ns, int(n.extra_fields.alloc_size)))
            walk(n.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    cur = peak = 0
    for _, size in sorted(events):
        cur += size
        peak = max(peak, cur)
    return out, int(peak)
