"""Evidence after repair (docs/evidence.md, "After repair"): which signal predicts the cost of removing a block once
its linear bridge stands in its place.

Beside the raw ground truth (each block removed alone) it measures the *bridged* ground truth
(:func:`swapkl.evidence.bridged_truth.bridged_ground_truth`: each block removed with its bridge, on the same held-out
windows) and adds one signal, ``bridged_kl``: per block, KL(base ‖ block ℓ bridged) on the contract's scoring
prompts (the span ``[ℓ, ℓ+1)`` of the third matrix, :func:`swapkl.repair.bridged_kl.bridged_scores`).  Every
signal's Spearman ρ is reported against both ground truths (and against the bridged ground truth's KL to the base,
the quantity ``bridged_kl`` estimates on the prompts) with 95 % CIs from the evidence's joint bootstrap
(prompts and windows drawn once per replicate, the two ground truths resampled with the same window draws), so
every coefficient and every difference between two of them is paired.

The selection rule (:data:`RULE`, stated before any number): the signal with the largest ρ against the bridged
ground truth predicts the cost after repair; when the paired bootstrap CI of ρ(first) − ρ(second) includes 0, the
statement says ``tie``; when the first's own CI reaches 0 or below, it adds that no signal is shown to predict.
"""
from __future__ import annotations

import numpy as np

from swapkl.evidence import agreement as A
from swapkl.evidence.report import bridge_line
from swapkl.evidence.signals import SIGNAL_BRIDGED as SIGNAL
from swapkl.evidence.signals import bridged_kl_signal
from swapkl.stats import finite_ci, tie

RAW_GT = A.GT_NAMES[0]
BRIDGED_GT = "ground_truth_bridged_ppl"
BRIDGED_GT_KL = "ground_truth_bridged_kl"
RULE = ("largest Spearman ρ against the bridged ground truth (held-out ΔPPL % of each block removed with its "
        "bridge); a tie when the paired bootstrap CI of ρ(first) − ρ(second) includes 0; no signal is shown to "
        "predict when the first's ρ CI reaches 0 or below")


def rho_table(names, truth: str, vectors: dict, reps: dict) -> dict:
    """``{signal: {"rho": ρ, "ci": [lo, hi]}}``: Spearman ρ of every signal of ``names`` against ``truth`` over the
    layers where both are finite (scipy), with the percentile CI of the same coefficient over ``reps``."""
    out = {}
    for s in names:
        m = np.isfinite(vectors[s]) & np.isfinite(vectors[truth])
        out[s] = {"rho": A.spearman(vectors[s], vectors[truth]),
                  "ci": finite_ci(A.spearman_rows(reps[s][:, m], reps[truth][:, m]))}
    return out


def verdict(cmp: dict) -> dict:
    """The rule applied to a :func:`swapkl.evidence.agreement.compare_to` result: ``{"best", "second", "rho",
    "rho_ci", "diff", "diff_ci", "tie"}`` (``second`` None when one signal could be ranked)."""
    best = cmp.get("best")
    if best is None:
        return {"best": None}
    ranked = sorted((s for s in cmp["others"]), key=lambda s: -cmp["rho"][s])
    out = {"best": best, "rho": cmp["rho"][best], "rho_ci": cmp["best_ci"], "second": None}
    if ranked:
        second = ranked[0]
        lo, hi = cmp["others"][second]["diff_ci"]
        out |= {"second": second, "diff": cmp["rho"][best] - cmp["rho"][second], "diff_ci": [lo, hi],
                "tie": tie([lo, hi])}
    return out


def statement(v: dict) -> str:
    """"after a bridge, X predicts the cost best: ρ 0.83 [0.41, 0.97]; vs Y: Δρ 0.12 [-0.05, 0.40] (tie)"."""
    if v.get("best") is None:
        return "after a bridge, no signal could be ranked against the bridged ground truth"
    s = f"after a bridge, {v['best']} predicts the cost best: ρ {v['rho']:.2f}{_ci(v['rho_ci'])}"
    if v.get("second") is not None:
        tail = "tie" if v["tie"] else f"{v['best']} better"
        s += f"; vs {v['second']}: Δρ {v['diff']:.2f}{_ci(v['diff_ci'])} ({tail})"
    lo = (v.get("rho_ci") or [None])[0]
    if lo is None or lo <= 0:
        s += "; its ρ CI includes 0 or less: no signal is shown to predict the cost after a bridge here"
    return s


def _ci(ci) -> str:
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and ci[0] is not None else ""


def after_repair(ck, contract, ev, corpus, res, signals, gt, settings, n_boot: int, use_cache: bool = True,
                 batch_size=None, should_stop=None) -> dict:
    """The ``repair`` part of the evidence result for checkpoint ``ck``, scoring ``contract`` (its result ``res``),
    evaluator ``ev`` on ``corpus``, the raw ``signals`` and ground truth ``gt``, and
    :class:`~swapkl.repair.settings.BridgeSettings` ``settings`` (module docstring)."""
    from swapkl.evidence.bridged_truth import bridged_ground_truth
    from swapkl.measure.evaluate import eval_ids
    from swapkl.evidence.ground_truth import text_key
    from swapkl.repair.bridged_kl import bridged_scores
    from swapkl.repair.bridger import Bridger
    from swapkl.scoring.score import contract_prompts

    L = ck.num_layers
    br = bridged_scores(ck, contract, settings, use_cache=use_cache, pairs=[(i, i + 1) for i in range(L)],
                        should_stop=should_stop)
    sig = bridged_kl_signal(br, L)
    scoring_corpus, prompts, _ = contract_prompts(ck, contract)
    bridger = Bridger(ck.model, ck.tokenizer, scoring_corpus, settings, contract, prompts)
    bgt, rec = bridged_ground_truth(bridger, eval_ids(corpus, ck.tokenizer, ev), ev,
                                    {"text": text_key(corpus, ev), "identity": ck.identity} if use_cache else None,
                                    region=gt.region, batch_size=batch_size, should_stop=should_stop)
    sigs = [*signals, sig]
    names = [s.name for s in sigs]
    vectors = {s.name: np.asarray(s.values, float) for s in sigs}
    vectors[RAW_GT], vectors[BRIDGED_GT] = np.asarray(gt.delta_ppl_pct), np.asarray(bgt.delta_ppl_pct)
    vectors[BRIDGED_GT_KL] = np.asarray(bgt.kl)
    reps = A.replicate_vectors(sigs, gt, res.num_prompts, n_boot,
                               extra_truths={BRIDGED_GT: (bgt, "ppl"), BRIDGED_GT_KL: (bgt, "kl")})
    cmp = {t: A.compare_to(t, names, vectors, reps) for t in (RAW_GT, BRIDGED_GT)}
    v = verdict(cmp[BRIDGED_GT])
    return {"rule": RULE, "statement": statement(v), "verdict": v,
            "verdict_raw": verdict(cmp[RAW_GT]),
            "agreement": {"raw": rho_table(names, RAW_GT, vectors, reps),
                          "bridged": rho_table(names, BRIDGED_GT, vectors, reps),
                          "bridged_kl": rho_table(names, BRIDGED_GT_KL, vectors, reps)},
            "comparison": cmp, "signal": {SIGNAL: vectors[SIGNAL].tolist()},
            "signal_source": sig.source,
            "ground_truth": A.ground_truth_record(bgt) | {"forms": rec["forms"]},
            "contract": {"bridge": rec["settings"], "calibration": rec["calibration"],
                         "bridged_kl": {"spans": "[l, l+1) for every block l", "prompts": res.num_prompts,
                                        "aggregation": "mean over prompts",
                                        "calibration": "the bridge calibration above (one for both)"},
                         "evaluation": "the raw ground truth's held-out windows (paired)",
                         "evaluator": ev.to_dict(),
                         "bootstrap": f"{n_boot} joint resamples of prompts and windows, seed 0"}}


def text(rep: dict) -> str:
    """The agreement tables (ρ against the raw and the bridged ground truth, ΔPPL, and the bridged KL) and the
    statement, plain text."""
    ag = rep["agreement"]
    c = rep["contract"]
    lines = ["", "After repair: Spearman ρ [95 % CI] of every signal against the held-out cost of removing each "
             "block alone", f"  bridge: {bridge_line(c['bridge'])}; calibration: {c['calibration'].get('tokens')} "
             f"tokens, {c['calibration'].get('region', '?')}", "",
             f"  {'signal':<14} {'vs raw ground truth':<24} {'vs bridged ground truth':<24} {'vs bridged KL':<24}"]
    for s in ordered(rep):
        kl = (ag.get("bridged_kl") or {}).get(s) or {}
        lines.append(f"  {s:<14} {_cell(ag['raw'][s]):<24} {_cell(ag['bridged'][s]):<24} {_cell(kl):<24}")
    lines += ["", f"  rule: {rep['rule']}", f"  {rep['statement']}"]
    return "\n".join(lines)


def _num(x) -> float:
    """A coefficient for sorting: None or NaN (not ranked) sorts last."""
    return float(x) if x is not None and np.isfinite(x) else -9.0


def _cell(e: dict) -> str:
    r = e.get("rho")
    if _num(r) == -9.0:
        return "n/a"
    return f"{r:+.2f}{_ci(e.get('ci'))}"


def ordered(rep: dict) -> list:
    """The signals by ρ against the bridged ground truth, highest first (unranked last)."""
    bridged = rep["agreement"]["bridged"]
    return sorted(bridged, key=lambda s: -_num(bridged[s].get("rho")))


def rows(rep: dict) -> list[dict]:
    """The "after repair" table: one row per signal (highest ρ against the bridged ground truth first)."""
    ag = rep["agreement"]
    return [{"signal": s, "ρ vs raw ground truth": _cell(ag["raw"][s]), "ρ vs bridged ground truth":
             _cell(ag["bridged"][s]), "ρ vs bridged KL": _cell((ag.get("bridged_kl") or {}).get(s) or {})}
            for s in ordered(rep)]


def check_part(rep, what: str = "evidence file") -> None:
    """Refuse (one line, :class:`~swapkl.errors.SwapklError`) a ``repair`` part that is not what
    :func:`after_repair` writes: the statement, the rule, both agreement tables and the bridge contract."""
    from swapkl.errors import SwapklError

    def table_ok(t):
        return isinstance(t, dict) and all(isinstance(v, dict) and "rho" in v and isinstance(v.get("ci"), list)
                                           and len(v["ci"]) == 2 for v in t.values())

    ok = (isinstance(rep, dict) and isinstance(rep.get("statement"), str) and isinstance(rep.get("rule"), str)
          and isinstance(rep.get("agreement"), dict) and table_ok(rep["agreement"].get("raw"))
          and table_ok(rep["agreement"].get("bridged"))
          and set(rep["agreement"]["raw"]) == set(rep["agreement"]["bridged"])
          and isinstance(rep.get("contract"), dict) and isinstance(rep["contract"].get("bridge"), dict))
    if not ok:
        raise SwapklError(f"{what}: malformed 'repair' part (expected the statement, the rule, the raw and bridged "
                          "agreement tables and the bridge contract written by 'swapkl evidence --repair bridge')")
