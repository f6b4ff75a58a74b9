"""Transfer of the decision (docs/compare.md §2): is it safe to score model A and prune model B?

For each protocol and n = 1..budget: the set the guided rule (:func:`swapkl.removal.selection.select`, as the
``replacement`` / ``interchange`` methods pick it) chooses on A's scores and the set it chooses on B's own scores,
both removed from B and evaluated on B's held-out windows (the removal curves' evaluator, text and memo:
:class:`swapkl.removal.curves.CurvesRun`).  The difference ΔPPL(A's set) − ΔPPL(B's set), in percentage points,
comes with a paired bootstrap 95 % CI over B's shared windows (:func:`swapkl.removal.recommend.paired.paired_delta`):
``worse`` when the CI lies above zero (A's set costs B more), ``better`` below, ``tie`` when it includes zero.
"""
from __future__ import annotations

from swapkl.compare.agreement import PROTOCOLS, CompareError, check_comparable, matrix
from swapkl.removal.recommend.paired import paired_delta
from swapkl.removal.selection import select


def chosen_sets(res, protocol: str, budget: int, spacing: int = 1, candidates=None, partners=None) -> list:
    """The nested sets the guided rule picks on ``res``'s ``protocol`` scores for n = 1..budget (may stop short)."""
    return select(matrix(res, protocol), budget, spacing=spacing, candidates=candidates, partners=partners,
                  strict=False)


def transfer(ck_b, a, b, budget: int, evaluator="matched", corpus=None, *, spacing: int = 1, memo=None,
             progress=None, should_stop=None, batch_size: int | None = None, eval_ids=None) -> dict:
    """The transfer table (module docstring) on the loaded checkpoint ``ck_b`` of result ``b``.

    Returns ``{"budget", "evaluator", "corpus", "baseline_ppl", "n_windows", "spacing", "protocols": {protocol:
    [{"n", "set_a", "set_b", "same", "delta_a", "delta_a_ci", "delta_b", "delta_b_ci", "diff", "ci", "word"}]},
    "notes"}`` (ΔPPL in % of B's baseline; ``diff`` in percentage points)."""
    from swapkl.measure import evaluate as E  # deferred: pulls torch
    from swapkl.removal.checks import check_scores
    from swapkl.removal.curves import CurvesRun
    from swapkl.removal.plan import RemovalPlan, RunHooks

    check_comparable(a, b)
    if budget < 1:
        raise CompareError(f"the transfer budget must be at least 1 (got {budget})")
    scores_b = {p: matrix(b, p) for p in PROTOCOLS}
    check_scores(scores_b, ck_b.num_layers, b.identity, ck_b.identity,
                 what="B's scores are for another model than the B checkpoint")
    plan = RemovalPlan(budget=budget, methods=PROTOCOLS, spacing=spacing, evaluator=evaluator, kl=False,
                       batch_size=batch_size)
    run = CurvesRun(ck_b.model, ck_b.tokenizer, scores_b, plan,
                    RunHooks(progress=progress, should_stop=should_stop, memo=memo, identity=ck_b.identity,
                             corpus=corpus, eval_ids=eval_ids))
    curves_b = run.run()
    base = run.baseline
    out = {"budget": budget, "evaluator": run.ev.to_dict(), "corpus": curves_b.corpus, "spacing": spacing,
           "baseline_ppl": base.ppl, "baseline_ppl_ci": list(base.ci()), "n_windows": int(len(base.counts)),
           "protocols": {}, "notes": list(curves_b.notes)}
    for protocol in PROTOCOLS:
        sets_a = chosen_sets(a, protocol, budget, spacing, run.checked.candidates)
        rows = []
        for entry in curves_b.methods.get(protocol, []):
            n = entry["n"]
            if n > len(sets_a):
                out["notes"].append(f"{protocol}: A's score order stops at n={len(sets_a)}")
                break
            set_a, set_b = sets_a[n - 1], entry["removed"]
            ra, rb = run.evaluate_set(set_a), run.evaluate_set(set_b)
            st = paired_delta(ra.nll, [rb.nll], base.nll, base.counts)
            rows.append({"n": n, "set_a": [int(i) for i in set_a], "set_b": [int(i) for i in set_b],
                         "same": sorted(set_a) == sorted(set_b),
                         "delta_a": E.delta_pct(ra, base), "delta_a_ci": list(E.delta_pct_ci(ra, base)),
                         "delta_b": E.delta_pct(rb, base), "delta_b_ci": list(E.delta_pct_ci(rb, base)),
                         "diff": st["diff"], "ci": st["ci"], "word": st["word"]})
        out["protocols"][protocol] = rows
    return out
