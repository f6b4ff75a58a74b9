"""Blocks vs attention vs MLP removal on the built-in default model at equal non-embedding parameters removed, both
protocols guiding (issue 28, "the common-axis table"; docs/units-removal.md).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 10 python bench/units_removal_default.py \
        [--max-words 2000 --prompts 8 --tokens 64 --context 512] [--json bench/results/units-removal-default.json]

SmolLM2-135M-Instruct (30 layers).  For each unit: swap-KL scores (adjacent pairs, one contract per unit differing
only in ``unit``; the score cache is used), then removal curves guided by replacement and by interchange and the BI
baseline (``swapkl.removal.curves.removal_curves``: blocks deleted, sublayers skipped) up to the number of units
whose parameters match removing 4 blocks.  For n = 1..4 blocks: the attention and MLP counts removing the closest
number of non-embedding parameters, each set's held-out ΔPPL % with its paired bootstrap CI (windows resampled), the
paired CI of the difference between the two protocols' sets, and what each set gains, measured base vs pruned in
one run (:func:`swapkl.removal.gains.measure_gains`, the skipping runtime, CPU).  Guided selection: the guided
rule's candidates (layers 1..L-2) with spacing 1 for blocks and spacing 0 for sublayers (16 attention sublayers
cannot keep a gap of one among 28 candidates).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UNITS = ("block", "attention", "mlp")
METHODS = ("replacement", "interchange", "bi")


def diff_ci(a, b, base, n_boot=1000, seed=0):
    """Paired bootstrap (windows) 95 % CI of ΔPPL%(a) - ΔPPL%(b), both against ``base`` (PPLResults)."""
    from swapkl.scoring.results import bootstrap_indices, percentile_ci

    idx = bootstrap_indices(len(base.counts), n_boot, seed)
    c = base.counts[idx].sum(1)
    da = 100.0 * (np.exp((a.nll[idx].sum(1) - base.nll[idx].sum(1)) / c) - 1.0)
    db = 100.0 * (np.exp((b.nll[idx].sum(1) - base.nll[idx].sum(1)) / c) - 1.0)
    return [float(x) for x in percentile_ci(da - db)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-words", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch

    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.removal.curves import removal_curves
    from swapkl.removal.evaluate import Evaluator
    from swapkl.removal.gains import measure_gains
    from swapkl.removal.memo import EvalMemo
    from swapkl.removal.units import unit_key_suffix
    from swapkl.removal.verdict import regime_verdict
    from swapkl.scoring.corpora import load_corpus
    from swapkl.scoring.score import score
    from swapkl.store import dump_json
    from swapkl.surgery.removal_set import RemovalSet
    from swapkl.surgery.sizes import unit_sizes

    t_all = time.perf_counter()
    ck = load_checkpoint("default", device="cpu")
    L, sizes = ck.num_layers, unit_sizes(ck.model)
    ne = sizes["non_embedding"]
    ev = Evaluator(f"matched@{a.max_words}w", a.max_words, 512, 256)
    corpus = load_corpus()
    per = {u: float(np.mean(sizes[u])) for u in UNITS}
    counts = {n: {u: (n if u == "block" else max(1, int(round(n * per["block"] / per[u])))) for u in UNITS}
              for n in range(1, a.blocks + 1)}
    budget = {u: max(c[u] for c in counts.values()) for u in UNITS}
    out = {"model": ck.identity.get("display") or "default", "num_layers": L, "cpu_threads": torch.get_num_threads(),
           "evaluator": ev.to_dict(), "corpus": corpus.describe(), "sizes": sizes, "counts": counts, "units": {}}
    memo = EvalMemo()
    curves = {}
    for u in UNITS:
        t0 = time.perf_counter()
        res = score(ck, Contract(pairs="adjacent", prompts=a.prompts, tokens=a.tokens, device="cpu", unit=u))
        t_score = time.perf_counter() - t0
        scores = {"replacement": res.replacement(), "interchange": res.interchange()}
        t0 = time.perf_counter()
        c = removal_curves(ck.model, ck.tokenizer, scores, budget[u], list(METHODS), ev, corpus, memo=memo, unit=u,
                           spacing=1 if u == "block" else 0, identity=ck.identity)
        curves[u] = c
        v = regime_verdict(scores["replacement"], scores["interchange"])
        out["units"][u] = {"score_seconds": round(t_score, 1), "curves_seconds": round(time.perf_counter() - t0, 1),
                           "verdict": {k: v[k] for k in ("regime", "prefer", "sentence") if k in v},
                           "curves": c.to_dict()}
        print(f"{u}: scored in {t_score:.0f}s, curves to n={budget[u]} in {time.perf_counter() - t0:.0f}s; "
              f"{v.get('sentence', '')}", flush=True)
    base = memo.peek(_key(curves, ev, corpus), [])
    rows = []
    for n, cnt in counts.items():
        sets = {}
        for u in UNITS:
            key = _key(curves, ev, corpus) + unit_key_suffix(u)
            for m in METHODS:
                e = curves[u].methods[m][cnt[u] - 1] if len(curves[u].methods[m]) >= cnt[u] else None
                if e is None:
                    continue
                rs = RemovalSet.of(e["removed"], u)
                sets[f"{u}:{m}"] = rs
                rows.append({"n_blocks": n, "unit": u, "method": m, "count": cnt[u], "removed": e["removed"],
                             "params_removed": sum(sizes[u][i] for i in e["removed"]),
                             "params_removed_pct": 100.0 * sum(sizes[u][i] for i in e["removed"]) / ne,
                             "delta_pct": e["delta_pct"], "delta_pct_ci": e["delta_pct_ci"],
                             "kl_to_base": e["kl_to_base"], "_res": memo.peek(key, e["removed"])})
        t0 = time.perf_counter()
        g = measure_gains(ck.model, sets, context=a.context, decode_tokens=32, repeats=3)
        for r in rows:
            if r["n_blocks"] == n and f"{r['unit']}:{r['method']}" in g["sets"]:
                gr = g["sets"][f"{r['unit']}:{r['method']}"]
                r.update({k: gr[k] for k in ("prefill_speedup", "decode_speedup", "memory_ratio", "kv_cache_bytes",
                                             "memory_bytes")})
        out.setdefault("gains_base", g["base"])
        out["gains_settings"] = g["settings"]
        print(f"n={n}: gains measured in {time.perf_counter() - t0:.0f}s", flush=True)
    for n in counts:
        for u in UNITS:
            rr = {r["method"]: r for r in rows if r["n_blocks"] == n and r["unit"] == u}
            if "replacement" in rr and "interchange" in rr:
                a_, b_ = rr["replacement"]["_res"], rr["interchange"]["_res"]
                rr["interchange"]["minus_replacement_ci"] = (
                    None if a_ is None or b_ is None or base is None else diff_ci(b_, a_, base))
    for r in rows:
        r.pop("_res", None)
    out["table"] = rows
    out["seconds"] = round(time.perf_counter() - t_all, 1)
    _print(rows)
    if a.json:
        dump_json(out, a.json, indent=1)
    return 0


def _key(curves, ev, corpus) -> str:
    return (f"test:{getattr(corpus, 'sha256', '?')}:{ev.max_words}:{ev.window}:{ev.stride}:{ev.drop_first_target}")


def _print(rows) -> None:
    print("n  unit       method        k   params%  ΔPPL% [95% CI]            prefill×  decode×  mem×   removed")
    for r in rows:
        ci = r["delta_pct_ci"]
        print(f"{r['n_blocks']}  {r['unit']:<10} {r['method']:<12} {r['count']:>3}  {r['params_removed_pct']:6.2f}  "
              f"{r['delta_pct']:+8.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]  "
              f"{r.get('prefill_speedup', float('nan')):.2f}     {r.get('decode_speedup', float('nan')):.2f}    "
              f"{r.get('memory_ratio', float('nan')):.3f}  {r['removed']}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
