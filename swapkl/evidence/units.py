"""Evidence for a sublayer unit (``attention`` / ``mlp``): the ground truth is the held-out cost (ΔPPL %, KL) of
skipping that sublayer of each layer alone (:func:`swapkl.evidence.ground_truth.unit_ground_truth`), and the signals
that are defined per sublayer are compared with it: both swap-KL protocols on the unit's matrices (a score whose
contract unit is the unit), BI around the sublayer and SLEB's first step (calibration PPL without the sublayer).
Block-only signals (CKA, Taylor, the residual statistics of whole blocks), the second region, the contract
comparisons and the set-level agreement are left out and said so in ``notes``.  The dict has the keys of
:func:`swapkl.evidence.run.compute_evidence`'s result (which wraps it), plus ``unit``."""
from __future__ import annotations

import time

from swapkl.evidence import agreement as A
from swapkl.evidence import stability as S

#: the registry signals defined per sublayer
UNIT_SIGNALS = ("bi", "sleb")


def compute_unit_evidence(ck, contract, ev, corpus, budget: int, n_boot: int, n_stability: int,
                          calib_tokens: int | None = None, use_cache: bool = True, progress=None, should_stop=None,
                          batch_size: int | None = None, signals=UNIT_SIGNALS, spans: dict | None = None):
    from swapkl.evidence.signals import registry_signals, signal_context, swap_signals
    from swapkl.measure import evaluate as E
    from swapkl.evidence.ground_truth import text_key, unit_ground_truth
    from swapkl.measure.memo import EvalMemo, disk_memo
    from swapkl.removal.selection import default_candidates, max_feasible
    from swapkl.scoring.score import score

    t0, unit, L = time.perf_counter(), contract.unit, ck.num_layers
    steps = []

    def report(msg):
        steps.append((msg, time.perf_counter() - t0))
        if progress is not None:
            progress(len(steps), 5, msg)

    report(f"swap-KL scores ({unit})")
    res = score(ck, contract, use_cache=use_cache, should_stop=should_stop)
    memo = disk_memo(ck.identity, kl=True) if use_cache else EvalMemo()
    report(f"ground truth: skipping each {unit} sublayer alone")
    ids = E.eval_ids(corpus, ck.tokenizer, ev)
    gt = unit_ground_truth(ck.model, ids, ev, memo, text_key(corpus, ev), unit, batch_size=batch_size,
                           region={"words": (spans or {}).get("evaluation")}, should_stop=should_stop)
    report("signals")
    names = [n for n in signals if n in UNIT_SIGNALS]
    ctx = signal_context(ck, corpus, ev, memo, names, calib_tokens, unit, should_stop)
    sigs = swap_signals(res) + registry_signals(ctx, L, names)
    report("agreement")
    vectors, agree, comparison = A.against_ground_truth(sigs, gt, res.num_prompts, n_boot)
    report("stability")
    idx = S.prompt_bootstrap(res.num_prompts, n_stability)
    cands, stab = default_candidates(L), {}
    for s in sigs:
        if s.resample is not None:
            stab[s.name] = S.signal_stability(s.values, s.resample(idx), min(budget, max_feasible(cands, 1)), cands, 1)
    what = f"the {unit} sublayer of each layer"
    notes = [f"unit {unit}: the ground truth skips {what} alone (its residual branch removed); signals defined per "
             f"sublayer only (swap-KL of the {unit} unit, {', '.join(names) or 'no registry signal'}); block-only "
             "signals, the second region, contract comparisons and set-level agreement are not computed per unit"]
    data = {"unit": unit, "layers": list(range(L)),
            "ground_truth": A.ground_truth_record(gt),
            "signals": {s.name: vectors[s.name].tolist() for s in sigs},
            "signal_sources": {s.name: s.source for s in sigs},
            "agreement": agree, "comparison": comparison,
            "headline": A.headline(comparison["ground_truth_ppl"], f"single-{unit} removal ΔPPL"),
            "headline_kl": A.headline(comparison["ground_truth_kl"], f"single-{unit} KL to the base"),
            "stability": stab, "region": None, "contracts": [], "set_agreement": None, "budget": budget,
            "contract": {"model": ck.identity, "scoring": res.contract, "prompts": res.num_prompts, "unit": unit,
                         "evaluator": ev.to_dict(), "corpus": corpus.describe(), "regions": spans or {},
                         "dtype": ck.dtype, "bootstrap": {"agreement": n_boot, "stability": n_stability,
                                                          "ground_truth_ci": "1000 window resamples, seed 0"},
                         "selection": {"guided": "layers 1..L-2, spacing 1", "others": "every layer, no spacing"}},
            "notes": notes,
            "timing": {"seconds": time.perf_counter() - t0, "steps": steps, "ground_truth_computed": gt.computed,
                       "ground_truth_seconds": gt.seconds}}
    return data
