"""The numbers of one study row, from a model's finished analyses (pure over results; nothing is evaluated here).

* :func:`protocol_gap`: the median interchange / replacement KL ratio over the pair set, with its prompt-bootstrap
  CI;
* :func:`removal_rows`: per n, the held-out ΔPPL % of the replacement- and interchange-guided sets, their ratio
  I/R and their difference I − R with paired window-bootstrap CIs (the same windows), and the best baseline;
* :func:`predictors`: which signal predicts single-block removal cost (Spearman ρ with CIs), raw and after a
  bridge;
* :func:`layer_order`: the adjacent-pair scores of each protocol with prompt-bootstrap replicates, for the rank
  agreement of two models of one depth (:mod:`swapkl.study.across`).
"""
from __future__ import annotations

import numpy as np

from swapkl.compare.agreement import pair_replicates, pair_vector

from swapkl.removal.recommend.paired import paired_delta
from swapkl.stats import BOOT_SEED, bootstrap_indices, finite_ci, tie

PROTOCOLS = ("replacement", "interchange")
#: methods that are not baselines (the guided ones and their anti-guided controls)
NOT_BASELINES = ("replacement", "interchange", "consensus-mean", "consensus-max", "anti", "anti-replacement",
                 "anti-interchange")
#: the consensus methods of both protocols (docs/consensus.md), compared with the better and the worse protocol
CONSENSUS = ("consensus-mean", "consensus-max")
#: prompt-bootstrap replicates kept per model for the rank agreement across models
ORDER_BOOT = 200


def protocol_gap(res, n_boot: int) -> dict:
    """``{"median", "ci", "n_pairs", "pairs"}``: the median over the result's scored pairs of d_inter / d_repl
    (unitless; pairs with d_repl = 0 left out) and its 95 % CI over ``n_boot`` prompt resamples (seed 0)."""
    pairs = [tuple(p) for p in res.pairs]
    r, i = pair_vector(res, "replacement", pairs), pair_vector(res, "interchange", pairs)
    ok = np.isfinite(r) & np.isfinite(i) & (r > 0)
    if not ok.any():
        return {"median": None, "ci": [None, None], "n_pairs": 0, "pairs": res.contract.get("pairs")}
    idx = bootstrap_indices(res.num_prompts, n_boot, BOOT_SEED)
    kept = [p for p, o in zip(pairs, ok) if o]
    rr, ii = pair_replicates(res, "replacement", kept, idx), pair_replicates(res, "interchange", kept, idx)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.nanmedian(np.where(rr > 0, ii / rr, np.nan), axis=1)
    return {"median": float(np.median(i[ok] / r[ok])), "ci": finite_ci(np.asarray(draws, float)), "n_pairs": int(ok.sum()),
            "pairs": res.contract.get("pairs")}


def _delta_draws(nll: np.ndarray, base_nll: np.ndarray, counts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """ΔPPL % of one set on each window resample of ``idx`` (B, W): the paired bootstrap's draws."""
    return 100.0 * (np.exp((nll[idx].sum(1) - base_nll[idx].sum(1)) / counts[idx].sum(1)) - 1.0)


def _best_baseline(curves, n: int) -> dict | None:
    rows = [(name, e["delta_pct"]) for name, entries in curves.methods.items() if name not in NOT_BASELINES
            for e in entries if e["n"] == n and e.get("delta_pct") is not None]
    if not rows:
        return None
    name, d = min(rows, key=lambda t: t[1])
    return {"method": name, "delta_pct": float(d)}


def removal_rows(curves, lookup, baseline, n_boot: int) -> list[dict]:
    """Per n of ``curves`` (a :class:`~swapkl.removal.curves.CurvesResult`): ``{"n", "replacement": {"removed",
    "delta_pct", "delta_pct_ci"}, "interchange": {...}, "ratio", "ratio_ci", "diff", "diff_ci", "word",
    "best_baseline"}``.  ``ratio`` = ΔPPL %(I) / ΔPPL %(R) (the paper's I/R); ``diff`` = ΔPPL %(I) − ΔPPL %(R) in
    points with :func:`~swapkl.removal.recommend.paired.paired_delta`'s CI and word (``better``: interchange-guided removal
    is cheaper; ``tie``: the CI includes 0).  ``lookup(removed) -> PPLResult`` reads the run's memo; ``baseline``:
    the unpruned model's PPLResult on the same windows; CIs from ``n_boot`` window resamples (seed 0)."""
    idx = bootstrap_indices(len(baseline.counts), n_boot, BOOT_SEED)
    out = []
    by = {p: {e["n"]: e for e in curves.methods.get(p, [])} for p in PROTOCOLS}
    for n in sorted(set(by["replacement"]) & set(by["interchange"])):
        er, ei = by["replacement"][n], by["interchange"][n]
        row = {"n": n, "best_baseline": _best_baseline(curves, n)}
        for p, e in (("replacement", er), ("interchange", ei)):
            row[p] = {"removed": e["removed"], "delta_pct": e["delta_pct"], "delta_pct_ci": e.get("delta_pct_ci")}
        pr, pi = lookup(er["removed"]), lookup(ei["removed"])
        row["ratio"] = ei["delta_pct"] / er["delta_pct"] if er["delta_pct"] else None
        row["ratio_ci"], row["diff"], row["diff_ci"], row["word"] = [None, None], None, [None, None], None
        if pr is not None and pi is not None:
            dr = _delta_draws(pr.nll, baseline.nll, baseline.counts, idx)
            di = _delta_draws(pi.nll, baseline.nll, baseline.counts, idx)
            with np.errstate(divide="ignore", invalid="ignore"):
                row["ratio_ci"] = finite_ci(np.where(dr != 0, di / dr, np.nan))
            st = paired_delta(pi.nll, [pr.nll], baseline.nll, baseline.counts, n_boot=n_boot)
            row["diff"], row["diff_ci"], row["word"] = st["diff"], st["ci"], st["word"]
        out.append(row)
    return out


def consensus_rows(curves, lookup, baseline, n_boot: int) -> list[dict]:
    """docs/consensus.md, "The comparison it must win", on held-out ΔPPL %: per n and consensus method, ΔPPL %(C)
    − ΔPPL %(better of R and I) and − ΔPPL %(worse) with paired window-bootstrap CIs (the same windows and
    resamples as :func:`removal_rows`; better: the lower point estimate on that n), and whether R and I differ
    significantly.  ``{"n", method: {"vs_better", "vs_better_ci", "vs_worse", "vs_worse_ci", "worse_than_better",
    "r_i_differ", "cheaper_than_worse"}}``."""
    idx = bootstrap_indices(len(baseline.counts), n_boot, BOOT_SEED)
    by = {m: {e["n"]: e for e in curves.methods.get(m, [])} for m in (*PROTOCOLS, *CONSENSUS)}
    out = []
    for n in sorted(set(by["replacement"]) & set(by["interchange"])):
        res = {m: lookup(by[m][n]["removed"]) if n in by[m] else None for m in by}
        if res["replacement"] is None or res["interchange"] is None:
            continue
        draws = {m: _delta_draws(r.nll, baseline.nll, baseline.counts, idx) for m, r in res.items() if r is not None}
        point = {m: by[m][n]["delta_pct"] for m in res if res[m] is not None}
        ri = finite_ci(draws["interchange"] - draws["replacement"])
        better, worse = sorted(PROTOCOLS, key=lambda p: point[p])
        row = {"n": n}
        for c in CONSENSUS:
            if c not in draws:
                continue
            vb, vw = finite_ci(draws[c] - draws[better]), finite_ci(draws[c] - draws[worse])
            row[c] = {"vs_better": point[c] - point[better], "vs_better_ci": vb, "vs_worse": point[c] - point[worse],
                      "vs_worse_ci": vw, "worse_than_better": not tie(vb) and vb[0] > 0, "r_i_differ": not tie(ri),
                      "cheaper_than_worse": not tie(vw) and vw[1] < 0}
        out.append(row)
    return out


def _rho(agreement: dict, signal: str, truth: str) -> dict:
    return {"rho": agreement["spearman"].get(signal, {}).get(truth),
            "ci": agreement["spearman_ci"].get(signal, {}).get(truth, [None, None])}


def _pick(rho_r: dict, rho_i: dict, cmp: dict) -> dict:
    """Which of replacement and interchange predicts the cost better: the paired ρ-difference CI when one of them
    is the evidence's best signal (``by: "paired"``), else their CIs' overlap (``by: "overlap"``); a tie when the
    interval includes 0 (or the CIs overlap)."""
    best, others = cmp.get("best"), cmp.get("others") or {}
    for a, b in (("replacement", "interchange"), ("interchange", "replacement")):
        if best == a and b in others:
            lo, hi = others[b]["diff_ci"]
            return {"winner": None if tie([lo, hi]) else a, "by": "paired", "diff_ci": [lo, hi]}
    (lr, hr), (li, hi_) = rho_r["ci"], rho_i["ci"]
    if None in (lr, hr, li, hi_, rho_r["rho"], rho_i["rho"]):
        return {"winner": None, "by": "overlap", "diff_ci": [None, None]}
    overlap = not (lr > hi_ or li > hr)
    winner = None if overlap else ("replacement" if rho_r["rho"] > rho_i["rho"] else "interchange")
    return {"winner": winner, "by": "overlap", "diff_ci": [None, None]}


def predictors(evidence: dict) -> dict:
    """From an evidence result's dict (:meth:`~swapkl.evidence.run.EvidenceResult.to_dict`): ``{"raw": {"best",
    "best_rho", "best_ci", "replacement": {"rho", "ci"}, "interchange": {...}, "pick"}, "bridged": same after
    the bridge or None, "statement", "statement_bridged"}`` (Spearman ρ with the single-block held-out ΔPPL %)."""
    truth = "ground_truth_ppl"
    cmp = evidence["comparison"][truth]
    raw = {p: _rho(evidence["agreement"], p, truth) for p in PROTOCOLS}
    raw |= {"best": cmp.get("best"), "best_rho": (cmp.get("rho") or {}).get(cmp.get("best")),
            "best_ci": cmp.get("best_ci", [None, None]), "pick": _pick(raw["replacement"], raw["interchange"], cmp)}
    out = {"raw": raw, "bridged": None, "statement": evidence.get("headline"), "statement_bridged": None}
    rep = evidence.get("repair")
    if rep:
        ag = rep["agreement"]["bridged"]
        v = rep["verdict"]
        br = {p: {"rho": ag.get(p, {}).get("rho"), "ci": ag.get(p, {}).get("ci", [None, None])} for p in PROTOCOLS}
        bc = rep["comparison"]["ground_truth_bridged_ppl"]
        br |= {"best": v.get("best"), "best_rho": v.get("rho"), "best_ci": v.get("rho_ci", [None, None]),
               "pick": _pick(br["replacement"], br["interchange"], bc)}
        out["bridged"], out["statement_bridged"] = br, rep.get("statement")
    return out


def layer_order(res, n_boot: int = ORDER_BOOT) -> dict:
    """Per protocol ``{"values": (L-1,), "replicates": (B, L-1)}``: each adjacent pair's score (nats) and its
    value on ``n_boot`` prompt resamples (seed 0); pairs not scored are None."""
    L = res.num_layers
    pairs = [(i, i + 1) for i in range(L - 1)]
    idx = bootstrap_indices(res.num_prompts, n_boot, BOOT_SEED)
    out = {}
    for p in PROTOCOLS:
        v = pair_vector(res, p, pairs)
        ok = [k for k, x in enumerate(v) if np.isfinite(x)]
        reps = np.full((n_boot, len(pairs)), np.nan)
        if ok:
            reps[:, ok] = pair_replicates(res, p, [pairs[k] for k in ok], idx)
        out[p] = {"values": [float(x) if np.isfinite(x) else None for x in v],
                  "replicates": np.round(reps, 6).tolist()}
    return out
