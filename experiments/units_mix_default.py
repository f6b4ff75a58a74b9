"""The best mix of attention and MLP sublayers vs whole blocks on the built-in default model, at n = 1..4 blocks' worth
of non-embedding parameters removed (issue 28, "the best mix"; docs/units-removal.md).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 nice -n 10 python -m experiments run units_mix_default \
        [--max-words 1000 --context 256 --calib-tokens 256 --pool 24] [--json experiments/results/units-mix-default.json]

SmolLM2-135M-Instruct (30 layers).  The greedy mix (``swapkl.removal.methods.mix``, method ``mix``): on calibration
text (the corpus's prompt region, asserted disjoint from the held-out words), at each step skip the unit with the
least calibration-PPL increase per non-embedding parameter removed, until 4 blocks' worth; the set for n is the first
that reaches n blocks' worth.  ``--pool K``: after the first step (every one of the 60 units alone) only the K
cheapest units per parameter stay candidates (to fit a CPU run; recorded).  Each mix set and the whole-block sets of
the same n (replacement- and interchange-guided, read from ``experiments/results/units-removal-default.json`` and
re-evaluated here, so that the CI is paired over the same windows) get the held-out ΔPPL % with its bootstrap CI,
the paired bootstrap CI of ΔPPL%(mix) − ΔPPL%(block), and the gains measured base vs pruned in one run
(:func:`swapkl.measure.gains.measure_gains`, the skipping runtime, CPU).  The block / attention / MLP rows of the
common-axis table are those of ``units-removal-default.json`` (same evaluator contract), copied into the output.
``--guided``: also the guided mix (each unit's own replacement swap-KL per parameter, zero calibration evaluations;
scores the attention and MLP units, minutes on a CPU).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]

from experiments.units_removal_default import diff_ci  # noqa: E402  (the paired bootstrap of the units bench)


#: the configuration of the run the docs quote: the runner (python -m experiments run units_mix_default) passes each as --key value unless the command line gives it
CONFIG = {
    'blocks': 4,
    'calib_tokens': 256,
    'pool': 24,
    'prompts': 8,
    'tokens': 64,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--units-json", default=str(ROOT / "experiments" / "results" / "units-removal-default.json"))
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--calib-tokens", type=int, default=256)
    ap.add_argument("--pool", type=int, default=24)
    ap.add_argument("--context", type=int, default=None, help="gains context (default: the units bench's)")
    ap.add_argument("--guided", action="store_true")
    ap.add_argument("--no-gains", action="store_true", help="skip the measured gains (held-out ΔPPL only)")
    ap.add_argument("--no-greedy", action="store_true", help="skip the greedy mix (with --guided: the guided one only)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch

    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.measure import evaluate as E
    from swapkl.measure.evaluate import Evaluator
    from swapkl.measure.gains import measure_gains
    from swapkl.measure.memo import EvalMemo
    from swapkl.removal.methods import MethodContext
    from swapkl.removal.methods import mix as MX
    from swapkl.scoring.corpora import load_corpus
    from swapkl.store import dump_json
    from swapkl.surgery.removal_set import RemovalSet
    from swapkl.surgery.sizes import params_removed, unit_sizes
    from swapkl.surgery.skip import removed_copy

    units = json.loads(Path(a.units_json).read_text())
    t_all = time.perf_counter()
    ck = load_checkpoint("default", device="cpu")
    L, sizes = ck.num_layers, unit_sizes(ck.model)
    ne = sizes["non_embedding"]
    evd = units["evaluator"]
    ev = Evaluator(evd["name"], evd["max_words"], evd["window"], evd["stride"])
    context = a.context or units["gains_settings"]["context"]
    corpus = load_corpus()
    if corpus.sha256 != units["corpus"]["sha256"]:
        raise SystemExit("the corpus differs from the units bench's: its rows would not be comparable")
    ids = E.eval_ids(corpus, ck.tokenizer, ev)
    run = lambda m: E.evaluate_ppl(m, ids, ev.window, ev.stride)
    base = run(ck.model)
    print(f"baseline PPL {base.ppl:.4f} (units bench: {units['baseline_ppl']:.4f})", flush=True)
    ctx = MethodContext(model=ck.model, tokenizer=ck.tokenizer, scores={}, num_layers=L, candidates=[], spacing=0,
                        partners=None, corpus=corpus, evaluator=ev, seeds=[0], memo=EvalMemo(),
                        params={"mix": {"calib_tokens": a.calib_tokens, "pool": a.pool}},
                        progress=lambda d, t, msg: print(f"  {msg} ({time.perf_counter() - t0:.0f}s)", flush=True))
    t0 = time.perf_counter()
    methods, search_s, n_evals = {}, 0.0, 0
    if not a.no_greedy:
        methods["mix"] = MX.mix_greedy(ctx, a.blocks)
        search_s = time.perf_counter() - t0
        n_evals = methods["mix"].info["evaluations"]
        print(f"greedy mix: {n_evals} calibration evaluations in {search_s:.0f}s", flush=True)
    if a.guided:
        from swapkl.contract import Contract
        from swapkl.scoring.score import score

        t1 = time.perf_counter()
        us = {}
        for u in ("attention", "mlp"):
            res = score(ck, Contract(pairs="adjacent", prompts=a.prompts, tokens=a.tokens, device="cpu", unit=u))
            us[u] = {"replacement": res.replacement(), "interchange": res.interchange()}
        ctx.params["mix-guided"] = {"unit_scores": us}
        methods["mix-guided"] = MX.mix_guided(ctx, a.blocks)
        print(f"guided mix: scored in {time.perf_counter() - t1:.0f}s", flush=True)
    block_rows = {(r["n_blocks"], r["method"]): r for r in units["table"] if r["unit"] == "block"}
    rows, evaluated = [], {}

    def evaluate(rs):
        if rs not in evaluated:
            t1 = time.perf_counter()
            evaluated[rs] = run(removed_copy(ck.model, rs))
            print(f"  {rs.label()}: ΔPPL {E.delta_pct(evaluated[rs], base):+.2f}% ({time.perf_counter() - t1:.0f}s)",
                  flush=True)
        return evaluated[rs]

    for n in range(1, a.blocks + 1):
        blocks = {m: RemovalSet.of(block_rows[(n, m)]["removed"], "block") for m in ("replacement", "interchange")
                  if (n, m) in block_rows}
        for m, rs in blocks.items():
            r = evaluate(rs)
            rows.append({"n_blocks": n, "unit": "block", "method": m, "removal": rs.to_list(), "label": rs.label(),
                         "params_removed": params_removed(sizes, rs), "delta_pct": E.delta_pct(r, base),
                         "delta_pct_ci": list(E.delta_pct_ci(r, base)), "_rs": rs})
        for name, out in methods.items():
            if len(out.variant["sets"]) < n:
                continue
            rs = MX.decode(out.variant["sets"][n - 1])
            r = evaluate(rs)
            row = {"n_blocks": n, "unit": "mixed", "method": name, "removal": rs.to_list(), "label": rs.label(),
                   "params_removed": params_removed(sizes, rs), "delta_pct": E.delta_pct(r, base),
                   "delta_pct_ci": list(E.delta_pct_ci(r, base)), "_rs": rs,
                   "attention": len(rs.layers("attention")), "mlp": len(rs.layers("mlp")), "blocks": len(rs.blocks)}
            row["minus_block"] = {m: {"diff": row["delta_pct"] - E.delta_pct(evaluated[b], base),
                                      "ci": diff_ci(r, evaluated[b], base)} for m, b in blocks.items()}
            rows.append(row)
    gains_settings = None
    for n in range(1, a.blocks + 1) if not a.no_gains else ():
        sets = {f"{r['unit']}:{r['method']}": r["_rs"] for r in rows if r["n_blocks"] == n}
        t1 = time.perf_counter()
        g = measure_gains(ck.model, sets, context=context, decode_tokens=32, repeats=3)
        for r in rows:
            if r["n_blocks"] == n:
                gr = g["sets"][f"{r['unit']}:{r['method']}"]
                r.update({k: gr[k] for k in ("prefill_speedup", "decode_speedup", "memory_ratio", "kv_cache_bytes",
                                             "memory_bytes")})
        gains_settings = g["settings"]
        print(f"n={n}: gains measured in {time.perf_counter() - t1:.0f}s", flush=True)
    for r in rows:
        r.pop("_rs")
        r["params_removed_pct"] = 100.0 * r["params_removed"] / ne
    common = [{k: r.get(k) for k in ("n_blocks", "unit", "method", "removed", "params_removed", "params_removed_pct",
                                     "delta_pct", "delta_pct_ci", "prefill_speedup", "decode_speedup",
                                     "memory_ratio")} for r in units["table"]]
    out = {"model": ck.identity.get("display") or "default", "num_layers": L, "cpu_threads": torch.get_num_threads(),
           "evaluator": ev.to_dict(), "corpus": corpus.describe(), "baseline_ppl": base.ppl,
           "baseline_ppl_ci": list(base.ci()), "sizes": sizes,
           "mix": {name: {"settings": o.settings, "info": {k: v for k, v in o.info.items() if k != "steps"},
                          "steps": [{k: v for k, v in s.items() if k != "trials"} for s in o.info.get("steps", [])]}
                   for name, o in methods.items()},
           "search_seconds": round(search_s, 1), "calibration_evaluations": n_evals,
           "gains_settings": gains_settings, "table": rows,
           "units_table": {"from": str(Path(a.units_json).relative_to(ROOT)), "rows": common},
           "seconds": round(time.perf_counter() - t_all, 1)}
    _print(rows)
    if a.json:
        dump_json(out, a.json, indent=1)
    return 0


def _print(rows) -> None:
    print("n  set                      params%  ΔPPL% [95% CI]              mix − block [paired CI]   prefill× "
          "decode× mem×   removed")
    for r in rows:
        ci = r["delta_pct_ci"]
        vs = "; ".join(f"{m[:5]} {d['diff']:+.1f} [{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}]"
                       for m, d in (r.get("minus_block") or {}).items())
        print(f"{r['n_blocks']}  {r['unit'] + ':' + r['method']:<24} {r['params_removed_pct']:6.2f}  "
              f"{r['delta_pct']:+8.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]  {vs:<40} "
              f"{r.get('prefill_speedup', float('nan')):.2f}     {r.get('decode_speedup', float('nan')):.2f}    "
              f"{r.get('memory_ratio', float('nan')):.3f}  {r['label']}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
