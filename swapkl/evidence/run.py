"""``evidence``: ground truth, every signal, their agreement and stability on one checkpoint (docs/evidence.md).

:func:`compute_evidence` is the one entry point (the CLI and the dashboard's pipeline call it); it returns an
:class:`EvidenceResult` whose :meth:`~EvidenceResult.to_dict` has the keys other tools read: ``layers``,
``ground_truth`` {``delta_ppl_pct``, ``kl``}, ``signals``, ``agreement`` {``spearman``, ``kendall``}, ``stability``,
``contract``, plus CIs, the headline, the region effect and timings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from swapkl.errors import SwapklError
from swapkl.evidence import agreement as A
from swapkl.evidence import stability as S
from swapkl.scoring.results import finite_json
from swapkl.stats import bootstrap_indices, finite_ci
from swapkl.store import CorruptEntry, dump_json, read_entry, warn_unwritable, write_entry

DEFAULT_BUDGET = 4
DEFAULT_B_STABILITY = 200
DEFAULT_B_AGREEMENT = 1000
REGISTRY_SIGNALS = ("bi", "cka", "taylor", "sleb")
SIGNAL_KIND = "evidence-signals"


@dataclass
class EvidenceResult:
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return finite_json(self.data)

    def to_json(self, path=None, indent: int = 2) -> str:
        return dump_json(self.to_dict(), path, indent)

    def __getitem__(self, k):
        return self.data[k]


def regions(corpus, ev, n_regions: int = 2) -> dict:
    """Word ranges ``[start, end)`` of the evaluation regions (the first ``ev.max_words`` words, then the next
    ``ev.max_words`` when ``n_regions`` is 2 and the evaluation region holds them) and of the prompt region (scoring
    prompts and calibration text).  Raises :class:`SwapklError` if any two overlap (they never should)."""
    split = corpus.split_point
    if ev.max_words > split:
        raise SwapklError(f"corpus '{corpus.name}' has {split} words of evaluation text; the evaluator needs "
                          f"{ev.max_words}")
    out = {"evaluation": [0, ev.max_words], "prompts_and_calibration": [split, len(corpus.words)]}
    if n_regions >= 2 and 2 * ev.max_words <= split:
        out["evaluation_2"] = [ev.max_words, 2 * ev.max_words]
    spans = sorted(out.values())
    for (_a0, a1), (b0, _b1) in zip(spans, spans[1:]):
        if b0 < a1:
            raise SwapklError(f"evaluation and prompt regions overlap ({out}); refusing to compute")
    return out


def _region2_ids(corpus, tokenizer, ev, span):
    import torch

    text = " ".join(corpus.words[span[0]:span[1]])
    ids = torch.as_tensor(tokenizer(text)["input_ids"], dtype=torch.long).reshape(-1)
    return ids if ids.numel() >= ev.window else None


def _ground_truths(ck, corpus, ev, memo, spans, batch_size, should_stop, report):
    from swapkl.measure import evaluate as E
    from swapkl.evidence.ground_truth import ground_truth, text_key

    ids = E.eval_ids(corpus, ck.tokenizer, ev)
    report("ground truth: region 1")
    gt = ground_truth(ck.model, ids, ev, memo, text_key(corpus, ev), region={"words": spans["evaluation"]},
                      batch_size=batch_size, should_stop=should_stop)
    gt2 = None
    if "evaluation_2" in spans:
        ids2 = _region2_ids(corpus, ck.tokenizer, ev, spans["evaluation_2"])
        if ids2 is not None:
            report("ground truth: region 2")
            gt2 = ground_truth(ck.model, ids2, ev, memo, text_key(corpus, ev, spans["evaluation_2"][0]),
                               region={"words": spans["evaluation_2"]}, batch_size=batch_size,
                               should_stop=should_stop)
    return gt, gt2


def _signals(ck, res, corpus, ev, memo, calib_tokens, names, should_stop, use_cache=True):
    """Every signal; the forward-pass parts (residual statistics on the scoring prompts, the registry methods'
    scores) are cached per contract through :mod:`swapkl.store` (:func:`_signal_cache`)."""
    import torch

    from swapkl.evidence.signals import (Signal, consensus_signals, prompt_signals, registry_signals, signal_context,
                                         swap_signals)
    from swapkl.removal.methods.angular import residual_stats

    path = _signal_cache(ck, res, corpus, ev, calib_tokens, names) if use_cache else None
    cached = None
    if path is not None:
        try:
            cached = read_entry(path, SIGNAL_KIND)
        except CorruptEntry:
            cached = None
    if cached is not None:
        stats = {k: np.asarray(cached["stats"][k], float) for k in ("angular", "cos_adjacent")}
        reg = [Signal(r["name"], np.asarray(r["values"], float), r["source"]) for r in cached["registry"]]
    else:
        stats = residual_stats(ck.model, torch.as_tensor(res.prompt_token_ids, dtype=torch.long))
        ctx = signal_context(ck, corpus, ev, memo, names, calib_tokens, should_stop=should_stop)
        reg = registry_signals(ctx, ck.num_layers, names)
        if path is not None:
            data = {"stats": {k: np.asarray(v).tolist() for k, v in stats.items()},
                    "registry": [{"name": r.name, "values": r.values.tolist(), "source": r.source} for r in reg]}
            try:
                write_entry(path, SIGNAL_KIND, data)
            except OSError as e:
                warn_unwritable(path, e)
    swap = swap_signals(res)
    return swap + consensus_signals(swap, ck.num_layers) + prompt_signals(stats) + reg, stats


def _signal_cache(ck, res, corpus, ev, calib_tokens, names):
    """Where the signals of this model, scoring contract, prompts, calibration text and window are stored; None
    when the identity cannot name the weights."""
    from swapkl import __version__
    from swapkl.contract import stable_hash
    from swapkl.store import cache_root

    ident = {k: (ck.identity or {}).get(k) for k in ("kind", "id", "revision", "commit", "fingerprint", "dtype")}
    if not (ident["fingerprint"] or ident["commit"] or (ident["kind"] == "hub" and ident["revision"])):
        return None
    key = stable_hash({"model": ident, "contract": res.contract, "prompts": res.prompt_token_ids,
                       "corpus": corpus.sha256, "calib_tokens": calib_tokens, "window": ev.window,
                       "names": list(names), "version": __version__})[:24]
    return cache_root() / "evidence" / f"signals-{key}.json"


def _stability(signals, stats, num_prompts, L, budget, n_boot, spacing):
    from swapkl.removal.selection import default_candidates, max_feasible

    idx = S.prompt_bootstrap(num_prompts, n_boot)
    cands = default_candidates(L)
    out, notes = {}, []
    for s in signals:
        if s.resample is None:
            continue
        reps = s.resample(idx)
        if s.rule == "guided":
            out[s.name] = S.signal_stability(s.values, reps, min(budget, max_feasible(cands, spacing)), cands,
                                             spacing)
            if len(out[s.name]) < budget:
                notes.append(f"{s.name}: stability up to n={len(out[s.name])} only: the guided rule's order stops "
                             f"there (candidates 1..L-2, spacing Δ={spacing})")
        else:
            out[s.name] = S.signal_stability(s.values, reps, min(budget, L - 1), list(range(L)), 0)
    out["angular_blocks"] = S.angular_stability(np.asarray(stats["angular"]), idx, min(budget, L - 1))
    return out, notes


def _region_effect(gt, gt2, n_boot):
    if gt2 is None:
        return None
    rng = np.random.default_rng(2)
    d1, k1 = gt.resampled(bootstrap_indices(len(gt.counts), n_boot, rng))
    d2, k2 = gt2.resampled(bootstrap_indices(len(gt2.counts), n_boot, rng))
    out = {"region_1": gt.region, "region_2": gt2.region, "delta_ppl_pct_2": gt2.delta_ppl_pct, "kl_2": gt2.kl}
    for name, a, b, ra, rb in (("ppl", gt.delta_ppl_pct, gt2.delta_ppl_pct, d1, d2), ("kl", gt.kl, gt2.kl, k1, k2)):
        out[f"spearman_{name}"] = A.spearman(a, b)
        out[f"spearman_{name}_ci"] = finite_ci(A.spearman_rows(ra, rb))
        out[f"kendall_{name}"] = A.kendall(a, b)
        out[f"kendall_{name}_ci"] = finite_ci(A.kendall_rows(ra, rb))
    return out


def _after_repair(repair, report, ck, contract, ev, corpus, res, sigs, gt, n_boot, use_cache, batch_size,
                  should_stop):
    """The ``repair`` part (:func:`swapkl.evidence.repair.after_repair`) when ``repair`` (bridge settings) is given,
    else None."""
    if repair is None:
        return None
    from swapkl.evidence.repair import after_repair

    report("after repair: bridged KL and the bridged ground truth")
    return after_repair(ck, contract, ev, corpus, res, sigs, gt, repair, n_boot, use_cache, batch_size, should_stop)


def _definitions(wanted, ck, contract, res, gt, n_boot, use_cache, should_stop):
    """Which per-layer definition predicts the removal cost better (:mod:`swapkl.evidence.definitions`), or None."""
    if not wanted:
        return None
    from swapkl.evidence.definitions import compare_definitions

    return compare_definitions(ck, contract, res, gt, n_boot, use_cache, should_stop)


def _contract_record(ck, res, ev, corpus, spans, n_boot, n_stability, spacing) -> dict:
    """The ``contract`` entry of the evidence result: what every number of it was measured under."""
    return {"model": ck.identity, "scoring": res.contract, "prompts": res.num_prompts,
            "evaluator": ev.to_dict(), "corpus": corpus.describe(), "regions": spans,
            "dtype": ck.dtype, "bootstrap": {"agreement": n_boot, "stability": n_stability,
                                             "ground_truth_ci": "1000 window resamples, seed 0"},
            "selection": {"guided": f"layers 1..L-2, spacing {spacing}", "others": "every layer, no spacing"}}


def compute_evidence(ck, contract, ev, corpus, budget: int = DEFAULT_BUDGET, n_boot: int = DEFAULT_B_AGREEMENT,
                     n_stability: int = DEFAULT_B_STABILITY, n_regions: int = 2, calib_tokens: int | None = None,
                     signals=REGISTRY_SIGNALS, use_cache: bool = True, progress=None, should_stop=None,
                     batch_size: int | None = None, compare_contracts=(), sets: bool = True,
                     repair=None, definitions: bool = True, tasks=None) -> EvidenceResult:
    """Everything the evidence page and ``swapkl evidence`` show, for checkpoint ``ck`` (a loaded
    :class:`~swapkl.model.checkpoints.Checkpoint`), swap-KL ``contract``, evaluator ``ev`` and ``corpus``.
    ``compare_contracts``: :class:`~swapkl.evidence.contracts.Comparison` (or plain contracts for the same
    checkpoint); ``sets``: also the set-level agreement (:mod:`swapkl.evidence.sets`); ``repair``: a
    :class:`~swapkl.repair.settings.BridgeSettings` adds the ``repair`` part (:mod:`swapkl.evidence.repair`);
    ``definitions``: also score the other per-layer definition and say which predicts the removal cost better
    (:mod:`swapkl.evidence.definitions`); ``tasks``: a :class:`~swapkl.measure.task_runner.TaskSettings` adds the
    task ground truth (:mod:`swapkl.evidence.task_truth`: ``ground_truth_acc`` in the agreement, ``task_truth``,
    ``headline_acc`` and ``contract.tasks``)."""
    from swapkl.measure.memo import EvalMemo, disk_memo
    from swapkl.scoring.score import score

    t0 = time.perf_counter()
    L = ck.num_layers
    if budget < 1 or budget > L - 1:
        raise SwapklError(f"--budget must be between 1 and {L - 1} for a {L}-layer model (got {budget})")
    if n_boot < 10 or n_stability < 10:
        raise SwapklError("bootstrap resamples must be at least 10")
    spans = regions(corpus, ev, n_regions)
    if getattr(contract, "unit", "block") != "block":  # a sublayer unit: its own ground truth and signals
        if repair is not None or tasks is not None:
            raise SwapklError(f"{'--repair bridge' if repair is not None else '--tasks'} removes whole blocks: use "
                              "--unit block")
        from swapkl.evidence.units import compute_unit_evidence

        return EvidenceResult(compute_unit_evidence(ck, contract, ev, corpus, budget, n_boot, n_stability, calib_tokens, use_cache,
                                                    progress, should_stop, batch_size, signals, spans))
    disjoint = None
    if tasks is not None:  # a task built from text this evidence reads: one line, before anything is computed
        from swapkl.evidence.task_truth import check_disjoint

        disjoint = check_disjoint(ck, tasks, contract, corpus, max(e for k, (_b, e) in spans.items()
                                                                   if k.startswith("evaluation")), repair is not None)
    steps = []

    n_steps = (8 if sets else 7) + (repair is not None) + (tasks is not None)

    def report(msg):
        steps.append((msg, time.perf_counter() - t0))
        if progress is not None:
            progress(len(steps), n_steps, msg)

    report("swap-KL scores")
    res = score(ck, contract, use_cache=use_cache, should_stop=should_stop)
    memo = disk_memo(ck.identity, kl=True) if use_cache else EvalMemo()
    gt, gt2 = _ground_truths(ck, corpus, ev, memo, spans, batch_size, should_stop, report)
    report("signals")
    sigs, stats = _signals(ck, res, corpus, ev, memo, calib_tokens, signals, should_stop, use_cache)
    tt = None
    if tasks is not None:
        from swapkl.evidence.task_truth import measure

        report("task ground truth: the base and every block removed, through lm-eval")
        tt = measure(ck, tasks, None if progress is None else
                     (lambda d, t, m: progress(len(steps), n_steps, f"{m} ({d}/{t})")), should_stop)
    report("agreement")
    data = _measured(ck, contract, ev, corpus, res, memo, gt, gt2, sigs, stats, tt, spans, report, budget=budget,
                     n_boot=n_boot, n_stability=n_stability, calib_tokens=calib_tokens, signals=signals,
                     use_cache=use_cache, should_stop=should_stop, batch_size=batch_size,
                     compare_contracts=compare_contracts, sets=sets, repair=repair, definitions=definitions)
    if disjoint is not None:
        data["contract"]["tasks"]["disjoint"] = disjoint
    data["timing"] = {"seconds": time.perf_counter() - t0, "steps": steps,
                      "ground_truth_computed": gt.computed + (gt2.computed if gt2 else 0),
                      "ground_truth_seconds": gt.seconds + (gt2.seconds if gt2 else 0.0)}
    return EvidenceResult(data)


def _measured(ck, contract, ev, corpus, res, memo, gt, gt2, sigs, stats, tt, spans, report, *, budget, n_boot,
              n_stability, calib_tokens, signals, use_cache, should_stop, batch_size, compare_contracts, sets, repair,
              definitions) -> dict:
    """The agreement, stability, set agreement, contract comparisons, definitions and repair of one evidence run,
    as the result's dict (without its timing)."""
    from swapkl.evidence import contracts as K
    from swapkl.evidence import sets as SA
    from swapkl.evidence.signals import CONSENSUS

    L = ck.num_layers
    reps: dict = {}
    vectors, agree, comparison = A.against_ground_truth(sigs, gt, res.num_prompts, n_boot, tt, reps)
    after = _after_repair(repair, report, ck, contract, ev, corpus, res, sigs, gt, n_boot, use_cache, batch_size,
                          should_stop)
    report("stability")
    spacing = 1
    stab, notes = _stability(sigs, stats, res.num_prompts, L, budget, n_stability, spacing)
    region = _region_effect(gt, gt2, n_boot)
    set_agree = None
    if sets:
        report("set agreement: every method's sets, measured")
        cache = _signal_cache(ck, res, corpus, ev, calib_tokens, signals) if use_cache else None
        own = [s for s in sigs if s.name not in CONSENSUS]  # the consensus ranks are not set scores: not summed
        set_agree = SA.compute(ck, res, corpus, ev, memo, own, stats, budget, n_boot, calib_tokens, should_stop,
                               spacing, cache=cache and cache.with_name(f"sets-b{budget}-{cache.name[8:]}"))
    report("contract comparisons")
    contracts = K.agreement(ck, res, compare_contracts, n_boot, use_cache, should_stop)
    per_layer = _definitions(definitions, ck, contract, res, gt, n_boot, use_cache, should_stop)
    if region is None:
        notes.append("no second evaluation region (the corpus's evaluation region holds one evaluator text only)")
    contract_d = _contract_record(ck, res, ev, corpus, spans, n_boot, n_stability, spacing)
    data = {"layers": list(range(L)),
            "ground_truth": A.ground_truth_record(gt),
            "signals": {s.name: vectors[s.name].tolist() for s in sigs},
            "signal_sources": {s.name: s.source for s in sigs},
            "agreement": agree, "comparison": comparison,
            "headline": A.headline(comparison["ground_truth_ppl"]),
            "headline_kl": A.headline(comparison["ground_truth_kl"], "single-layer KL to the base"),
            "stability": stab, "region": region, "contracts": contracts, "set_agreement": set_agree,
            "budget": budget, "contract": contract_d, "notes": notes, "definitions": per_layer}
    if tt is not None:
        from swapkl.evidence.task_truth import GT_ACC, entry

        data["task_truth"] = entry(tt, vectors, agree, reps, [s.name for s in sigs])
        data["headline_acc"] = A.headline(comparison[GT_ACC], "single-block task accuracy loss (lm-eval)")
        contract_d["tasks"] = tt.contract
    if after is not None:
        data["repair"] = after
    return data

