"""Blocks vs attention vs MLP removal on the built-in default model at equal non-embedding parameters removed, both
protocols guiding (issue 28, "the common-axis table"; docs/units-removal.md).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 10 python -m experiments run units_removal_default \
        [--max-words 2000 --prompts 8 --tokens 64 --context 512] [--json experiments/results/units-removal-default.json]

SmolLM2-135M-Instruct (30 layers).  For each unit: swap-KL scores (adjacent pairs, one contract per unit differing
only in ``unit``; the score cache is used) and the sets the guided rule picks from each protocol's matrix
(``swapkl.removal.selection.select``, as the curves do).  For n = 1..4 blocks: the attention and MLP counts removing
the closest number of non-embedding parameters; each set evaluated once (blocks deleted, sublayers skipped,
``swapkl.surgery.skip.removed_copy``) with its held-out ΔPPL % and paired bootstrap CI (windows resampled), the
paired CI of the difference between the two protocols' sets, and what each set gains, measured base vs pruned in
one run (:func:`swapkl.measure.gains.measure_gains`, the skipping runtime, CPU).  Only the points of the table are
evaluated (not whole curves), to fit a CPU run.  Guided selection: the guided
rule's candidates (layers 1..L-2) with spacing 1 for blocks and spacing 0 for sublayers (16 attention sublayers
cannot keep a gap of one among 28 candidates).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


UNITS = ("block", "attention", "mlp")


#: the configuration of the run the docs quote: the runner (python -m experiments run units_removal_default) passes each as --key value unless the command line gives it
CONFIG = {
    'max_words': 2000,
    'prompts': 8,
    'tokens': 64,
    'blocks': 4,
    'context': 512,
}


def diff_ci(a, b, base, n_boot=1000, seed=0):
    """Paired bootstrap (windows) 95 % CI of ΔPPL%(a) - ΔPPL%(b), both against ``base`` (PPLResults)."""
    from swapkl.stats import bootstrap_indices, percentile_ci

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
    from swapkl.measure import evaluate as E
    from swapkl.measure.evaluate import Evaluator
    from swapkl.measure.gains import measure_gains
    from swapkl.removal.selection import default_candidates, layer_scores, select
    from swapkl.scoring.verdict import regime_verdict
    from swapkl.scoring.corpora import load_corpus
    from swapkl.scoring.score import score
    from swapkl.store import dump_json
    from swapkl.surgery.removal_set import RemovalSet
    from swapkl.surgery.sizes import unit_sizes
    from swapkl.surgery.skip import removed_copy

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
    ids = E.eval_ids(corpus, ck.tokenizer, ev)
    run = lambda m: E.evaluate_ppl(m, ids, ev.window, ev.stride)
    t0 = time.perf_counter()
    base = run(ck.model)
    out["baseline_ppl"], out["baseline_seconds"] = base.ppl, round(time.perf_counter() - t0, 1)
    print(f"baseline PPL {base.ppl:.4f} ({time.perf_counter() - t0:.0f}s per evaluation)", flush=True)
    rows, evaluated = [], {}
    for u in UNITS:
        t0 = time.perf_counter()
        res = score(ck, Contract(pairs="adjacent", prompts=a.prompts, tokens=a.tokens, device="cpu", unit=u))
        v = regime_verdict(res.replacement(), res.interchange())
        out["units"][u] = {"score_seconds": round(time.perf_counter() - t0, 1),
                           "verdict": {k: v[k] for k in ("regime", "prefer", "sentence") if k in v},
                           "layer_scores": {m: [None if x != x else float(x) for x in layer_scores(mat)]
                                            for m, mat in (("replacement", res.replacement()),
                                                           ("interchange", res.interchange()))}}
        print(f"{u}: scored in {time.perf_counter() - t0:.0f}s; {v.get('sentence', '')}", flush=True)
        spacing = 1 if u == "block" else 0
        for m, mat in (("replacement", res.replacement()), ("interchange", res.interchange())):
            sets = select(mat, budget[u], spacing=spacing, candidates=default_candidates(L), strict=False)
            for n, cnt in counts.items():
                if len(sets) < cnt[u]:
                    continue
                removed = sets[cnt[u] - 1]
                key = (u, tuple(removed))
                if key not in evaluated:
                    t1 = time.perf_counter()
                    evaluated[key] = run(removed_copy(ck.model, removed, u))
                    print(f"  {u} {m} k={cnt[u]} {removed}: ΔPPL {E.delta_pct(evaluated[key], base):+.2f}% "
                          f"({time.perf_counter() - t1:.0f}s)", flush=True)
                r = evaluated[key]
                p = sum(sizes[u][i] for i in removed)
                rows.append({"n_blocks": n, "unit": u, "method": m, "count": cnt[u], "removed": removed,
                             "params_removed": p, "params_removed_pct": 100.0 * p / ne,
                             "delta_pct": E.delta_pct(r, base), "delta_pct_ci": list(E.delta_pct_ci(r, base)),
                             "_res": r})
    for n in counts:
        sets = {f"{r['unit']}:{r['method']}": RemovalSet.of(r["removed"], r["unit"]) for r in rows if r["n_blocks"] == n}
        t0 = time.perf_counter()
        g = measure_gains(ck.model, sets, context=a.context, decode_tokens=32, repeats=3)
        for r in rows:
            if r["n_blocks"] == n:
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
                rr["interchange"]["minus_replacement_ci"] = diff_ci(rr["interchange"]["_res"],
                                                                    rr["replacement"]["_res"], base)
    for r in rows:
        r.pop("_res", None)
    out["table"] = rows
    out["seconds"] = round(time.perf_counter() - t_all, 1)
    _print(rows)
    if a.json:
        dump_json(out, a.json, indent=1)
    return 0


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
