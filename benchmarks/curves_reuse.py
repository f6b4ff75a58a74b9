"""Benchmark: memoised removal curves vs evaluating every curve point from scratch, and evaluator linearity.

    HF_HUB_OFFLINE=1 python -m benchmarks run curves_reuse [MODEL] [--budget 3] [--spacing 0] [--evaluator matched]

MODEL defaults to ../shared/models/stories260K.  Both sides use the same model, text, scores and sets:

* from scratch: every curve point (each method, each seed, each n) builds its pruned model and runs the
  evaluator on the test text, computing the KL to the base model with a base forward pass alongside (what a
  script without a memo or a cached reference does), and each method evaluates its own baseline;
  selection work (BI pass, SLEB calibration trials) is added at the cost the memoised run measured for it;
* memoised: :func:`swapkl.removal.curves.removal_curves` (one baseline, one evaluation per distinct removed set, KL
  from cached head inputs).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(ROOT / ".." / "shared" / "models" / "stories260K"))
    ap.add_argument("--budget", type=int, default=3)
    ap.add_argument("--spacing", type=int, default=0)
    ap.add_argument("--evaluator", default="matched")
    ap.add_argument("--methods", default="replacement,interchange,random,anti,bi,sleb")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--calib-tokens", type=int, default=1024)
    a = ap.parse_args()

    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from swapkl.scoring.score import score
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.contract import Contract
    from swapkl.scoring.corpora import load_corpus
    from swapkl.measure.evaluate import eval_ids, evaluate_ppl, get_evaluator
    from swapkl.surgery.blocks import pruned_copy
    from swapkl.removal.curves import removal_curves
    from swapkl.removal.plan import RemovalPlan, RunHooks

    ck = load_checkpoint(a.model, device="cpu")
    model, tok = ck.model, ck.tokenizer
    corpus = load_corpus()
    ev = get_evaluator(a.evaluator)
    res = score(ck, Contract(pairs="adjacent", prompts=8, tokens=32, device="cpu"))
    scores = {"replacement": res.replacement(), "interchange": res.interchange()}
    methods = a.methods.split(",")
    params = {"bi": {"calib_tokens": a.calib_tokens}, "sleb": {"calib_tokens": a.calib_tokens}}
    print(f"model {ck.identity.get('display')} ({ck.num_layers} layers), evaluator {ev.name} "
          f"({ev.max_words} words, {ev.window}/{ev.stride}), corpus {corpus.label}, threads {torch.get_num_threads()}")

    # warm-up (first forward pays one-off costs)
    ids = eval_ids(corpus, tok, ev)
    evaluate_ppl(model, ids[: ev.window], ev.window, ev.stride)

    t = time.perf_counter()
    r = removal_curves(model, tok, scores, RemovalPlan(budget=a.budget, methods=methods, evaluator=ev, spacing=a.spacing, method_params=params),
                       RunHooks(corpus=corpus))
    t_memo = time.perf_counter() - t
    selection = sum(v.get("selection_seconds", 0.0) for v in r.method_info.values())

    points = []  # (method label, removed) in curve order, every point as a naive script would evaluate it
    for name, entries in r.methods.items():
        if name in r.random_seeds:
            for seed, ents in r.random_seeds[name].items():
                points += [(f"{name}/{seed}", e["removed"]) for e in ents]
        else:
            points += [(name, e["removed"]) for e in entries]
    curves = sorted({p[0] for p in points})
    t = time.perf_counter()
    for _ in curves:  # each curve's own baseline
        evaluate_ppl(model, ids, ev.window, ev.stride)
    for _, removed in points:
        pm = pruned_copy(model, removed)
        evaluate_ppl(pm, ids, ev.window, ev.stride)          # PPL
        evaluate_ppl(model, ids, ev.window, ev.stride)       # base forward for the KL, alongside
    t_naive = time.perf_counter() - t + selection

    n_sets = len({frozenset(p[1]) for p in points})
    print(f"curve points: {len(points)} over {len(curves)} curves; distinct removed sets: {n_sets}; "
          f"test-text evaluations in the memoised run: {r.stats['evaluations']} (+1 baseline), "
          f"calibration evaluations: {r.stats['calibration_evaluations']}")
    print(f"from scratch: {t_naive:8.2f} s   (selection work {selection:.2f} s included)")
    print(f"memoised:     {t_memo:8.2f} s")
    print(f"speed-up:     {t_naive / t_memo:8.2f} x")

    print("\nevaluator cost vs text length (one model, same window/stride):")
    full = ids
    for n in (1024, 2048, 4096, 8192, min(16384, full.numel())):
        if n > full.numel():
            break
        t = time.perf_counter()
        rr = evaluate_ppl(model, full[:n], ev.window, ev.stride)
        dt = time.perf_counter() - t
        print(f"  {n:6d} tokens: {dt:7.3f} s  = {1000 * dt / n:6.3f} s per 1k tokens  ({len(rr.counts)} windows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
