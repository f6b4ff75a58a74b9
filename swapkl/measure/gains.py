"""What a removal gains, measured: parameters, prefill and decode throughput, and memory with the KV cache at a
stated context length, base and pruned in one run on the device the model is on.

The pruned model is the skipping runtime (:func:`swapkl.surgery.skip.removed_copy`: removed blocks deleted, removed
sublayers replaced by zeros, a skipped attention holding no cache).  Throughput: ``prefill`` = one forward over
``context`` tokens (with the cache on), ``decode`` = ``decode_tokens`` greedy steps of one token on that cache; base
and pruned measured alternately ``repeats`` times after a warm-up, median taken (tokens/s).  Memory: the bytes of
the parameters the model uses (a skipped sublayer's are not), the KV cache's bytes after prefill + decode (read from
the cache object), and on CUDA the measured peak allocation of the run (``peak_bytes``; None on the CPU, where
torch does not track it)."""
from __future__ import annotations

import statistics
import time

from swapkl.surgery.removal_set import as_removal_set


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def cache_bytes(cache) -> int:
    """Bytes of every key/value tensor a transformers cache object holds."""
    import torch

    seen, total = set(), 0
    layers = getattr(cache, "layers", None)
    groups = ([(getattr(x, "keys", None), getattr(x, "values", None)) for x in layers] if layers is not None else
              list(zip(getattr(cache, "key_cache", []), getattr(cache, "value_cache", []))))
    for pair in groups:
        for t in pair:
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return int(total)


def param_bytes(model) -> tuple[int, int]:
    """(parameters, bytes) the model's forward uses (tied tensors counted once)."""
    seen, n, b = set(), 0, 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
            b += p.numel() * p.element_size()
    return int(n), int(b)


def _one_run(model, ids, decode_tokens: int) -> dict:
    """Timed prefill over ``ids`` (1, T) and greedy decode of ``decode_tokens`` tokens; the cache's bytes."""
    import torch

    from swapkl.model.architectures import cached_forward

    dev = ids.device
    with torch.inference_mode():
        _sync(dev)
        t0 = time.perf_counter()
        out, past = cached_forward(model, ids, logits_to_keep=1)
        _sync(dev)
        t1 = time.perf_counter()
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(decode_tokens):
            out, past = cached_forward(model, tok, past)
            tok = out.logits[:, -1:].argmax(-1)
        _sync(dev)
        t2 = time.perf_counter()
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "kv_cache_bytes": cache_bytes(past)}


def measure_gains(model, removals: dict, unit: str = "block", context: int = 512, decode_tokens: int = 32,
                  repeats: int = 3, seed: int = 0) -> dict:
    """Base vs each removal set of ``removals`` (``{label: RemovalSet or layers of unit}``), one run.

    Returns ``{"settings": {...}, "base": row, "sets": {label: row}}``; a row holds ``removed`` (``[[layer, unit],
    ...]``), ``params``, ``param_bytes``, ``non_embedding_params``, ``prefill_tokens_per_s``,
    ``decode_tokens_per_s``, ``kv_cache_bytes`` at ``context + decode_tokens`` tokens, ``memory_bytes`` (params +
    KV cache), ``peak_bytes`` (CUDA only) and, for a set, the ratios to the base (``prefill_speedup``,
    ``decode_speedup``, ``memory_ratio``) and ``non_embedding_removed``."""
    import torch

    from swapkl.model import architectures as arch
    from swapkl.surgery.sizes import params_removed, unit_sizes
    from swapkl.surgery.skip import removed_copy

    loc = arch.locate(model)
    sizes = unit_sizes(model)
    dev = next(model.parameters()).device
    vocab = int(getattr(model.config, "vocab_size", 0) or loc.head.weight.shape[0])
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(seed)).to(dev)
    variants = {"base": (model, as_removal_set([], "block"))}
    for label, rem in removals.items():
        rs = as_removal_set(rem, unit).validate(loc.num_layers)
        variants[str(label)] = (removed_copy(model, rs).eval(), rs)
    times = {k: [] for k in variants}
    peaks = {}
    for k, (m, _) in variants.items():  # warm-up, and the peak of one run each
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        _one_run(m, ids[:, : min(context, 16)], 2)
        first = _one_run(m, ids, decode_tokens)
        peaks[k] = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
        times[k].append(first)
    for _ in range(max(0, repeats - 1)):
        for k, (m, _) in variants.items():
            times[k].append(_one_run(m, ids, decode_tokens))
    rows = {}
    for k, (m, rs) in variants.items():
        n, b = param_bytes(m)
        pre = statistics.median(t["prefill_s"] for t in times[k])
        dec = statistics.median(t["decode_s"] for t in times[k])
        kv = times[k][-1]["kv_cache_bytes"]
        removed = params_removed(sizes, rs)
        rows[k] = {"removed": rs.to_list(), "label": rs.label(), "params": n, "param_bytes": b,
                   "non_embedding_params": sizes["non_embedding"] - removed, "non_embedding_removed": removed,
                   "prefill_tokens_per_s": context / pre, "decode_tokens_per_s": decode_tokens / dec if dec else None,
                   "kv_cache_bytes": kv, "memory_bytes": b + kv, "peak_bytes": peaks[k]}
    base = rows.pop("base")
    for r in rows.values():
        r["prefill_speedup"] = r["prefill_tokens_per_s"] / base["prefill_tokens_per_s"]
        r["decode_speedup"] = (r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
                               if r["decode_tokens_per_s"] and base["decode_tokens_per_s"] else None)
        r["memory_ratio"] = r["memory_bytes"] / base["memory_bytes"]
    settings = {"device": str(dev), "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                "context": context, "decode_tokens": decode_tokens, "repeats": repeats, "batch": 1,
                "threads": torch.get_num_threads() if dev.type == "cpu" else None,
                "runtime": "swapkl skipping runtime (removed sublayers not computed, no KV cache for a skipped "
                           "attention)"}
    return {"settings": settings, "base": base, "sets": rows}


def gains_line(row: dict) -> str:
    """One line of a set's gains: ``-12.3% params, prefill ×1.10, decode ×1.08, memory ×0.91``."""
    parts = []
    ne = row.get("non_embedding_removed")
    total = (row.get("non_embedding_params") or 0) + (ne or 0)
    if ne is not None and total:
        parts.append(f"-{100.0 * ne / total:.1f}% non-emb params")
    for key, name in (("prefill_speedup", "prefill"), ("decode_speedup", "decode"), ("memory_ratio", "memory")):
        if row.get(key) is not None:
            parts.append(f"{name} ×{row[key]:.2f}")
    return ", ".join(parts)


def curve_gains(model, result, context: int = 512, decode_tokens: int = 32, repeats: int = 3) -> dict:
    """:func:`measure_gains` for every single removal set of a :class:`~swapkl.removal.curves.CurvesResult`
    (deterministic methods; each distinct set measured once), in the result's unit.  Adds ``points``:
    ``{method: {n: key of "sets"}}`` so a table can put each point's gain beside its ΔPPL."""
    keys, points = {}, {}
    for name, entries in result.methods.items():
        for e in entries:
            if e.get("removed") is None or e.get("merge"):
                continue
            key = ",".join(str(i) for i in sorted(e["removed"]))
            keys[key] = e["removed"]
            points.setdefault(name, {})[str(e["n"])] = key
    out = measure_gains(model, keys, unit=getattr(result, "unit", "block"), context=context,
                        decode_tokens=decode_tokens, repeats=repeats)
    out["points"] = points
    return out


def point_gains(result, method: str, n: int) -> dict | None:
    """The measured gains row of ``method`` at ``n`` in a curves result (or its dict) with gains, or None."""
    g = (result.get("gains") if isinstance(result, dict) else getattr(result, "gains", None)) or {}
    key = (g.get("points") or {}).get(method, {}).get(str(n))
    return None if key is None else (g.get("sets") or {}).get(key)
