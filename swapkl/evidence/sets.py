"""Set-level agreement (docs/evidence.md §3, "sets"): across the sets the removal methods chose at n = 1..budget,
how well each signal's *set score* orders their measured held-out cost.

* The sets: every method of :data:`SET_METHODS` runs through :func:`swapkl.removal.curves.removal_curves` with the
  evidence run's evaluator and memo (the evaluations ``curves`` makes and reuses); at each n the distinct sets they
  chose are kept (with the methods that chose each).
* The measured cost of a set S: held-out ΔPPL % and mean KL(base ‖ pruned) per token, from that evaluation.
* The set score of a signal: the sum of its per-layer scores over S (every signal; for the literature rule
  "lowest n" the chosen set is the one with the smallest sum), and two methods' own set scores: ``sleb_set``,
  SLEB's objective (calibration PPL of the model without S), and ``angular_blocks``, the angular method's
  ``d(a, b+1)`` for a block S = a..b (mean over the scoring prompts; NaN for a set that is not one block).
* Coefficients: per n, Spearman ρ and Kendall τ-b from :mod:`scipy.stats` over that n's sets (at least 3 with a
  finite score).  Pooled within n: ranks are taken within each n and never compared across n (ΔPPL grows with n):
  ρ = Pearson correlation of the within-n ranks centred per n (``pooled_spearman``, = scipy's ρ for one n, =
  ``scipy.stats.pearsonr`` of the concatenated centred ranks), τ = τ-b over the pairs of sets of the same size
  (``pooled_kendall``, = scipy's τ for one n).  Not reported (None, with a note) below :data:`MIN_PAIRS` pairs.
* CIs: a joint bootstrap: replicate b resamples the scoring prompts (per-prompt signals recomputed), the
  evaluation windows (every set's cost recomputed, paired with the baseline) and the sets within each n (the
  usual bootstrap of a correlation over its observations: with few sets, which sets happened to be chosen is the
  largest uncertainty).  The best signal (pooled ρ against ΔPPL, among the signals that score every set) is
  compared with every other such signal by the paired CI of the difference: indistinguishable when it holds 0,
  worse otherwise.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from swapkl.evidence import agreement as A
from swapkl.stats import bootstrap_indices, finite_ci, tie

SET_METHODS = ("replacement", "interchange", "bi", "cka", "taylor", "sleb", "angular")
OWN_SCORE = {"replacement": "replacement", "interchange": "interchange", "bi": "bi", "cka": "cka",
             "taylor": "taylor", "sleb": "sleb_set", "angular": "angular_blocks"}
MIN_PAIRS = 3


# ------------------------------------------------------------------------------------------------ coefficients
def _groups(groups, finite: np.ndarray) -> list[np.ndarray]:
    return [g[finite[g]] for g in groups]


def pooled_spearman(s: np.ndarray, c: np.ndarray, groups) -> np.ndarray:
    """Pooled within-group Spearman ρ of every row pair of (B, K) arrays: ranks (average ranks for ties) within
    each group of column indices, centred per group; Pearson correlation of those over all groups."""
    num = np.zeros(s.shape[0])
    ds, dc = np.zeros_like(num), np.zeros_like(num)
    for g in groups:
        if len(g) < 2:
            continue
        rs = stats.rankdata(s[:, g], axis=1)
        rc = stats.rankdata(c[:, g], axis=1)
        rs -= rs.mean(1, keepdims=True)
        rc -= rc.mean(1, keepdims=True)
        num += (rs * rc).sum(1)
        ds += (rs ** 2).sum(1)
        dc += (rc ** 2).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / np.sqrt(ds * dc)


def pooled_kendall(s: np.ndarray, c: np.ndarray, groups) -> np.ndarray:
    """Pooled within-group Kendall τ-b: ``Σ sx·sy / sqrt(Σ|sx| Σ|sy|)`` over the pairs i < j of the same group."""
    iu = np.concatenate([g[np.triu_indices(len(g), 1)[0]] for g in groups] or [np.zeros(0, int)])
    ju = np.concatenate([g[np.triu_indices(len(g), 1)[1]] for g in groups] or [np.zeros(0, int)])
    sx, sy = np.sign(s[:, iu] - s[:, ju]), np.sign(c[:, iu] - c[:, ju])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sx * sy).sum(1) / np.sqrt(np.abs(sx).sum(1) * np.abs(sy).sum(1))


def n_pairs(groups) -> int:
    return int(sum(len(g) * (len(g) - 1) // 2 for g in groups))


def _value(v) -> float | None:
    v = float(v)
    return v if np.isfinite(v) else None


def per_n(score: np.ndarray, cost: np.ndarray, groups, ns) -> dict:
    """``{"<n>": {"spearman", "kendall", "sets"}}`` from scipy over each n's sets with a finite score (None
    below 3 sets or with a constant vector)."""
    out = {}
    for n, g in zip(ns, _groups(groups, np.isfinite(score))):
        x, y = score[g], cost[g]
        ok = len(g) >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0
        out[str(n)] = {"sets": int(len(g)),
                       "spearman": _value(stats.spearmanr(x, y).statistic) if ok else None,
                       "kendall": _value(stats.kendalltau(x, y).statistic) if ok else None}
    return out


def within_draws(groups, K: int, n_boot: int, rng) -> np.ndarray:
    """(B, K) column indices: each group's columns replaced by a draw with replacement from that group (the sets
    of each n resampled among themselves; other columns kept)."""
    sel = np.tile(np.arange(K), (n_boot, 1))
    for g in groups:
        if len(g):
            sel[:, g] = np.asarray(g)[bootstrap_indices(len(g), n_boot, rng)]  # = rng.choice(g, (n_boot, len(g)))
    return sel


def coefficients(scores: dict, costs: dict, score_reps: dict, cost_reps: dict, groups, seed: int = 5) -> dict:
    """For each cost (``ground_truth_ppl``, ``ground_truth_kl``) and signal: pooled ρ and τ with 95 % CIs, the
    number of within-n pairs, whether the signal scores every set (``all_sets``), and the replicate ρ (kept for the
    comparison, not emitted).  Replicate b also resamples the sets within each n (the same draw for every signal
    that scores all sets, so their differences are paired)."""
    rng = np.random.default_rng(seed)
    K = len(next(iter(costs.values())))
    n_boot = len(next(iter(cost_reps.values())))
    common = within_draws(groups, K, n_boot, rng)
    out = {c: {} for c in costs}
    for sname, score in scores.items():
        idx = np.flatnonzero(np.isfinite(score))
        gs = [np.flatnonzero(np.isin(idx, g)) for g in groups]  # the groups in the columns ``idx``
        k, full = n_pairs(gs), len(idx) == K
        sel = common if full else within_draws(gs, len(idx), n_boot, rng)
        for cname, cost in costs.items():
            row = {"pairs": k, "all_sets": bool(full), "spearman": None, "spearman_ci": [None, None],
                   "kendall": None, "kendall_ci": [None, None], "_reps": None}
            if k >= MIN_PAIRS:
                sr = np.take_along_axis(score_reps[sname][:, idx], sel, 1)
                cr = np.take_along_axis(cost_reps[cname][:, idx], sel, 1)
                r_rho = pooled_spearman(sr, cr, gs)
                row.update(spearman=_value(pooled_spearman(score[idx][None], cost[idx][None], gs)[0]),
                           kendall=_value(pooled_kendall(score[idx][None], cost[idx][None], gs)[0]),
                           spearman_ci=finite_ci(r_rho), kendall_ci=finite_ci(pooled_kendall(sr, cr, gs)), _reps=r_rho)
            out[cname][sname] = row
    return out


def compare(rows: dict) -> dict:
    """The signal with the largest pooled ρ among those that score every set and, for each other such signal, the
    paired CI of ρ(best) − ρ(other); signals that score only some sets are listed in ``not_compared``."""
    ok = [s for s, r in rows.items() if r["spearman"] is not None and r["all_sets"]]
    ranked = sorted(ok, key=lambda s: -rows[s]["spearman"])
    skipped = [s for s, r in rows.items() if r["spearman"] is not None and not r["all_sets"]]
    if not ranked:
        return {"best": None, "others": {}, "not_compared": skipped}
    best = ranked[0]
    others = {}
    for s in ranked[1:]:
        lo, hi = finite_ci(rows[best]["_reps"] - rows[s]["_reps"])
        others[s] = {"rho": rows[s]["spearman"], "diff_ci": [lo, hi],
                     "verdict": "indistinguishable" if tie([lo, hi]) else "worse"}
    return {"best": best, "rho": rows[best]["spearman"], "best_ci": rows[best]["spearman_ci"], "others": others,
            "not_compared": skipped}


def headline(cmp: dict, n_sets: int, pairs: int, budget: int) -> str:
    what = f"the {n_sets} distinct sets the methods chose at n = 1..{budget} ({pairs} pairs of the same size)"
    if cmp.get("best") is None:
        return f"too few distinct sets to rank: {what}; the set-level agreement is not reported"
    lo, hi = cmp["best_ci"]
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    s = f"across {what}, {cmp['best']} orders their held-out ΔPPL best (pooled ρ = {cmp['rho']:.2f}{ci})"
    s += A.verdict_tail(cmp["others"])
    if cmp.get("not_compared"):
        s += f" ({', '.join(cmp['not_compared'])}: scores only some of the sets, not compared)"
    return s + "."


# ------------------------------------------------------------------------------------------------ set scores
def chosen_sets(methods: dict, budget: int) -> list[dict]:
    """The distinct sets of a curves ``methods`` dict (``{name: [{n, removed}, ...]}``) at n = 1..budget, in
    order of n then first appearance: ``[{"n", "set", "methods"}]``."""
    out, seen = [], {}
    for n in range(1, budget + 1):
        for name, entries in methods.items():
            for e in entries:
                if e.get("n") != n or e.get("removed") is None:
                    continue
                key = (n, tuple(sorted(int(i) for i in e["removed"])))
                if key not in seen:
                    seen[key] = {"n": n, "set": list(key[1]), "methods": []}
                    out.append(seen[key])
                seen[key]["methods"].append(name)
    return out


def additive(values: np.ndarray, sets: list[list[int]]) -> np.ndarray:
    """Set scores ``Σ_{ℓ in S} values[..., ℓ]`` for every set: (..., L) → (..., K); NaN when a layer is NaN."""
    return np.stack([values[..., s].sum(-1) for s in sets], -1)


def block_scores(ang: np.ndarray, sets: list[list[int]], idx: np.ndarray | None = None) -> np.ndarray:
    """``angular_blocks``: ``mean over prompts of ang[p, a, b+1]`` for a block S = a..b, NaN otherwise; ``ang``
    (P, L+1, L+1) per-prompt distances; with ``idx`` (B, P) prompt resamples, (B, K)."""
    cols = []
    for s in sets:
        a, b = min(s), max(s)
        if list(s) != list(range(a, b + 1)):
            cols.append(np.full(1 if idx is None else len(idx), np.nan))
            continue
        v = ang[:, a, b + 1]
        cols.append(np.array([v.mean()]) if idx is None else v[idx].mean(1))
    out = np.stack(cols, -1)
    return out[0] if idx is None else out


# ------------------------------------------------------------------------------------------------ the run
SETS_KIND = "evidence-sets"


def _choose(ck, res, corpus, ev, memo, b, calib_tokens, should_stop, spacing, cache) -> tuple[list, list]:
    """The distinct sets at n = 1..b with SLEB's set score (``sleb_set``) and the runner's notes: from ``cache``
    (a store entry) when it is there and the memo holds every set's evaluation, else by running the methods."""
    from swapkl.removal import methods as M
    from swapkl.removal.curves import removal_curves
    from swapkl.evidence.ground_truth import text_key
    from swapkl.removal.plan import RemovalPlan, RunHooks
    from swapkl.store import CorruptEntry, read_entry, warn_unwritable, write_entry

    key = text_key(corpus, ev)
    try:
        hit = read_entry(cache, SETS_KIND) if cache is not None else None
    except CorruptEntry:
        hit = None
    if hit is not None and memo.peek(key, []) is not None and all(
            getattr(memo.peek(key, f["set"]), "kl", None) is not None for f in hit["sets"]):
        return hit["sets"], hit["notes"]
    plan = RemovalPlan(budget=b, methods=tuple(SET_METHODS), spacing=spacing, evaluator=ev, calib_tokens=calib_tokens)
    scores = res.protocol_scores()
    cr = removal_curves(ck.model, ck.tokenizer, scores, plan,
                        RunHooks(should_stop=should_stop, memo=memo, identity=ck.identity, corpus=corpus))
    found = chosen_sets(cr.methods, b)
    ctx = plan.check(ck.num_layers, scores).context(ck.model, ck.tokenizer, RunHooks(should_stop=should_stop),
                                            corpus=corpus, evaluator=ev, memo=memo)
    sleb_tokens = M.calib_tokens(ctx, "sleb")
    for f in found:
        f["sleb_set"] = ctx.calib_ppl(f["set"], sleb_tokens)
    if cache is not None:
        try:
            write_entry(cache, SETS_KIND, {"sets": found, "notes": list(cr.notes)})
        except OSError as e:
            warn_unwritable(cache, e)
    return found, list(cr.notes)


def compute(ck, res, corpus, ev, memo, sigs, stats_, budget: int, n_boot: int, calib_tokens=None, should_stop=None,
            spacing: int = 1, seed: int = 4, cache=None) -> dict:
    """The set-level agreement of one evidence run (module docstring): ``sigs`` the run's
    :class:`~swapkl.evidence.signals.Signal` list, ``stats_`` its residual statistics on the scoring prompts,
    ``memo`` its evaluation memo (shared with ``curves``); ``cache``: where the chosen sets are stored (a path
    keyed by everything that picks them; None: not stored)."""
    from swapkl.evidence.ground_truth import from_results, text_key
    from swapkl.removal.selection import default_candidates, max_feasible

    L, notes = ck.num_layers, []
    b = min(budget, max_feasible(default_candidates(L), spacing))
    if b < budget:
        notes.append(f"sets up to n={b} only: the guided rule's candidates (1..L-2, spacing Δ={spacing}) stop there")
    found, more = _choose(ck, res, corpus, ev, memo, b, calib_tokens, should_stop, spacing, cache)
    notes += more
    sets = [f["set"] for f in found]
    key = text_key(corpus, ev)
    cost = from_results(range(len(sets)), memo.peek(key, []), {k: memo.peek(key, s) for k, s in enumerate(sets)})
    rng = np.random.default_rng(seed)
    pidx = bootstrap_indices(max(1, res.num_prompts), n_boot, rng)
    widx = bootstrap_indices(len(cost.counts), n_boot, rng)
    scores, reps = {}, {}
    for s in sigs:
        scores[s.name] = additive(np.asarray(s.values, float), sets)
        reps[s.name] = (additive(s.resample(pidx), sets) if s.resample is not None
                        else np.repeat(scores[s.name][None], n_boot, 0))
    scores["sleb_set"] = np.array([f.pop("sleb_set") for f in found], float)
    reps["sleb_set"] = np.repeat(scores["sleb_set"][None], n_boot, 0)
    ang = np.asarray(stats_["angular"], float)
    scores["angular_blocks"], reps["angular_blocks"] = block_scores(ang, sets), block_scores(ang, sets, pidx)
    d, k = cost.resampled(widx)
    costs = {A.GT_NAMES[0]: np.asarray(cost.delta_ppl_pct), A.GT_NAMES[1]: np.asarray(cost.kl)}
    groups = [np.array([i for i, f in enumerate(found) if f["n"] == n], dtype=int) for n in range(1, b + 1)]
    pooled = coefficients(scores, costs, reps, {A.GT_NAMES[0]: d, A.GT_NAMES[1]: k}, groups)
    cmp = compare(pooled[A.GT_NAMES[0]])
    pairs = n_pairs(groups)
    if pairs < MIN_PAIRS:
        notes.append(f"too few distinct sets: {len(sets)} sets, {pairs} pairs of the same size (at least "
                     f"{MIN_PAIRS} needed); the methods mostly agree, so there is little to order")
    for rows in pooled.values():
        for r in rows.values():
            r.pop("_reps")
    for i, f in enumerate(found):
        f.update(delta_ppl_pct=cost.delta_ppl_pct[i], delta_ppl_pct_ci=cost.delta_ppl_pct_ci[i], kl=cost.kl[i],
                 kl_ci=cost.kl_ci[i], scores={name: _value(v[i]) for name, v in scores.items()})
    return {"budget": b, "methods": list(SET_METHODS), "own_score": dict(OWN_SCORE), "sets": found,
            "per_n": {c: {s: per_n(scores[s], costs[c], groups, range(1, b + 1)) for s in scores} for c in costs},
            "pooled": pooled, "comparison": cmp, "headline": headline(cmp, len(sets), pairs, b),
            "n_sets": len(sets), "n_pairs": pairs, "bootstrap": n_boot, "notes": notes}
