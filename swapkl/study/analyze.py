"""One model's study row, computed with the single-model pipeline: the swap-KL scores of ``score`` (cached per
chunk), the removal curves of ``curves`` (every evaluation in the model's disk memo) and the evidence of
``evidence`` (ground truth and signals cached), under the study's one plan -- so a row's numbers are the numbers
those commands print for the same contract, and an interrupted model resumes from their caches."""
from __future__ import annotations

import time

from swapkl.study.measure import consensus_rows, layer_order, predictors, protocol_gap, removal_rows
from swapkl.study.plan import StudyPlan

#: stability resamples of the evidence run (the study reads none of its stability figures)
EVIDENCE_STABILITY = 10
#: the evidence's stability budget (n = 1: the single-block cost is what the study ranks signals against)
EVIDENCE_BUDGET = 1


def removal_plan(plan: StudyPlan, ev):
    """The :class:`~swapkl.removal.plan.RemovalPlan` of ``swapkl curves --budget B --methods M --seeds S`` with
    the study's evaluator ``ev``: the guided selection rule (spacing 1, boundary excluded, all scored partners)."""
    from swapkl.removal.plan import RemovalPlan

    return RemovalPlan(budget=plan.budget, methods=tuple(plan.methods), exclude_boundary=True, partners=None,
                       seeds=tuple(range(plan.seeds)), kl=True, evaluator=ev)


def bridge_settings(plan: StudyPlan):
    """The evidence's bridge (the defaults of ``swapkl evidence --repair bridge``), or None without repair."""
    if plan.repair != "bridge":
        return None
    from swapkl.repair.bridged_kl import BridgeSettings

    return BridgeSettings(form="folded", calib_seed=0)


def _memo_reader(memo):
    """``(lookup(removed) -> PPLResult | None, baseline PPLResult)`` of a finished curves run's memo, on its
    held-out text (the key of the empty set that is not a calibration text)."""
    key = next(k[0] for k in memo.store if not k[1] and str(k[0]).startswith("test:"))
    return (lambda removed: memo.peek(key, removed)), memo.peek(key, ())


def analyze_model(ck, plan: StudyPlan, ev, corpus, progress=None, should_stop=None) -> dict:
    """The row of checkpoint ``ck`` (loaded) under ``plan``, evaluator ``ev`` and held-out ``corpus``:
    ``{"identity", "layers", "params", "non_embedding", "verdict", "gap", "removal": {"baseline_ppl", "rows"},
    "evidence", "order", "seconds": {step: s}}``.  ``progress(done, total, what)`` per step."""
    from swapkl.compare.agreement import verdict
    from swapkl.removal.curves import removal_curves
    from swapkl.measure.memo import disk_memo
    from swapkl.removal.plan import RunHooks
    from swapkl.scoring.score import score
    from swapkl.surgery.sizes import unit_sizes

    seconds, t = {}, time.perf_counter()
    say = progress or (lambda *_: None)
    disjoint = None
    if plan.tasks:  # a task built from text this row reads is refused before anything is computed
        from swapkl.study.tasks import check_disjoint

        disjoint = check_disjoint(plan, ev, corpus, ck)
    say(0, 3, "swap-KL scores (both protocols)")
    res = score(ck, plan.contract, should_stop=should_stop)
    seconds["scores"], t = time.perf_counter() - t, time.perf_counter()
    say(1, 3, f"removal curves up to n = {plan.budget}")
    memo = disk_memo(ck.identity, kl=True)
    scores = res.protocol_scores()
    curves = removal_curves(ck.model, ck.tokenizer, scores, removal_plan(plan, ev),
                            RunHooks(should_stop=should_stop, memo=memo, identity=ck.identity, corpus=corpus,
                                     contract=plan.contract))
    lookup, baseline = _memo_reader(memo)
    seconds["curves"], t = time.perf_counter() - t, time.perf_counter()
    evidence = None
    if plan.evidence:
        say(2, 3, "evidence: single-block removal cost and every signal" + (" (raw and bridged)"
                                                                            if plan.repair == "bridge" else ""))
        from swapkl.evidence.run import compute_evidence

        evidence = predictors(compute_evidence(
            ck, plan.contract, ev, corpus, budget=EVIDENCE_BUDGET, n_boot=plan.n_boot,
            n_stability=EVIDENCE_STABILITY, n_regions=1, signals=plan.signals, sets=False,
            repair=bridge_settings(plan), should_stop=should_stop).to_dict())
        seconds["evidence"], t = time.perf_counter() - t, time.perf_counter()
    tasks = None
    if plan.tasks:
        say(3, 4, "task accuracy: every guided set and every single block (lm-eval)")
        from swapkl.study.tasks import task_part

        tasks = task_part(ck, plan, curves, scores, should_stop=should_stop)
        tasks["contract"]["disjoint"] = disjoint
        seconds["tasks"] = time.perf_counter() - t
    say(3, 3, "done")
    sizes = unit_sizes(ck.model)
    return {"identity": ck.identity, "layers": ck.num_layers,
            "params": int(sum(p.numel() for p in ck.model.parameters())), "non_embedding": sizes["non_embedding"],
            "verdict": verdict(res), "gap": protocol_gap(res, plan.n_boot),
            "removal": {"baseline_ppl": curves.baseline_ppl, "baseline_ppl_ci": curves.baseline_ppl_ci,
                        "evaluator": curves.evaluator, "corpus": curves.corpus,
                        "rows": removal_rows(curves, lookup, baseline, plan.n_boot),
                        "consensus": consensus_rows(curves, lookup, baseline, plan.n_boot)},
            "evidence": evidence, "tasks": tasks, "order": layer_order(res), "seconds": seconds}
