"""Every layer signal on the same layers, oriented lower = safer to remove (docs/evidence.md §2).

A :class:`Signal` holds the full-sample per-layer score and, for signals built from per-prompt quantities, a
function that recomputes it from a resample of the scoring prompts (``resample(idx)``, idx (B, P) → (B, L)).

* ``replacement`` / ``interchange``: the guided rule's layer score ``min over scored partners of d(i, j)``
  (:func:`swapkl.removal.selection.layer_scores`), per prompt from the swap-KL vectors the engine keeps;
* ``bi_prompts``: Block Influence ``1 - mean cos(x_ℓ, x_ℓ+1)`` and ``angular``: ``mean arccos(cos(x_ℓ, x_ℓ+1))/π``,
  both per scoring prompt (one base forward over the prompts);
* ``bi``, ``cka`` (as ``1 - CKA``), ``taylor``: the registry methods' own scores on calibration text;
* ``sleb``: SLEB's first step, the calibration PPL of each single removal;
* ``consensus_mean`` / ``consensus_max``: the consensus of the two protocols' layer scores (docs/consensus.md,
  :func:`swapkl.scoring.consensus.walk_scores` over the guided rule's candidates 1..L-2: the consensus score with
  its ties broken as the consensus method breaks them; NaN at the boundary),
  recomputed per prompt resample from both protocols' resampled layer scores (the same draws);
* ``bridged_kl`` (``evidence --repair bridge``): KL(base ‖ block ℓ replaced by its linear bridge) per scoring prompt,
  the span ``[ℓ, ℓ+1)`` of the third matrix (:mod:`swapkl.repair.bridged_kl`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from swapkl.removal.selection import layer_scores
from swapkl.scoring.results import pair_draws

SIGNAL_BRIDGED = "bridged_kl"


@dataclass
class Signal:
    name: str
    values: np.ndarray  # (L,), lower = safer, NaN = not scored
    source: str
    resample: Callable[[np.ndarray], np.ndarray] | None = None  # prompt resamples (B, P) -> (B, L)
    rule: str = "lowest"  # "guided": the swap-KL rule's candidates and spacing; "lowest": every layer, no spacing


def pair_layer_min(pairs, values: np.ndarray, L: int) -> np.ndarray:
    """``s[:, i] = min over pairs (i, j) or (j, i) of values[:, p]``: the layer score of every row of ``values``
    ((B, npairs) → (B, L)); NaN for a layer without a pair."""
    out = np.full((values.shape[0], L), np.inf)
    for p, (i, j) in enumerate(pairs):
        out[:, i] = np.minimum(out[:, i], values[:, p])
        out[:, j] = np.minimum(out[:, j], values[:, p])
    out[np.isinf(out)] = np.nan
    return out


def swap_signals(res) -> list[Signal]:
    """``replacement`` and ``interchange`` from a :class:`~swapkl.scoring.results.SwapResult` (every scored pair is
    a partner, as in the guided rule's default)."""
    L, agg, pairs = res.num_layers, res.aggregation, list(res.pairs)
    out = []
    for k, (name, mat) in enumerate((("replacement", res.replacement()), ("interchange", res.interchange()))):
        def resample(idx, k=k):
            return pair_layer_min(pairs, pair_draws(res, idx, agg)[k], L)
        out.append(Signal(name, layer_scores(mat), f"swap-KL, {len(pairs)} pairs, min over partners",
                          resample if res.num_prompts > 1 else None, rule="guided"))
    return out


CONSENSUS = ("consensus_mean", "consensus_max")


def consensus_signals(swap: list[Signal], L: int) -> list[Signal]:
    """``consensus_mean`` and ``consensus_max`` from the ``replacement`` and ``interchange`` signals of ``swap``
    (:func:`swap_signals`): :func:`~swapkl.scoring.consensus.walk_scores` of their layer scores over the guided
    rule's candidates (the consensus score, its ties broken as the consensus method breaks them, so the signal's
    sets are the method's), lower = safer; ``resample(idx)`` ranks both protocols' layer scores of the same prompt
    draw."""
    from swapkl.removal.selection import default_candidates
    from swapkl.scoring.consensus import RULES, walk_scores

    by = {s.name: s for s in swap}
    r, i = by["replacement"], by["interchange"]
    cands = default_candidates(L)
    out = []
    for name in CONSENSUS:
        rule = name.split("_", 1)[1]

        def resample(idx, rule=rule):
            a, b = r.resample(idx), i.resample(idx)
            return np.stack([walk_scores(a[k], b[k], cands, rule) for k in range(len(a))])
        out.append(Signal(name, walk_scores(r.values, i.values, cands, rule),
                          f"{RULES[rule].label} of the replacement and interchange ranks, layers 1..L-2",
                          resample if r.resample is not None and i.resample is not None else None, rule="guided"))
    return out


def prompt_signals(stats: dict) -> list[Signal]:
    """``bi_prompts`` and ``angular`` from :func:`swapkl.removal.methods.angular.residual_stats` on the scoring
    prompts (rows = prompts)."""
    cos = np.asarray(stats["cos_adjacent"])  # (P, L)
    ang = np.asarray(stats["angular"])
    L = cos.shape[1]
    a1 = ang[:, np.arange(L), np.arange(L) + 1]  # (P, L): d(ℓ, ℓ+1)
    return [Signal("bi_prompts", 1.0 - cos.mean(0), "Block Influence per scoring prompt",
                   lambda idx: 1.0 - cos[idx].mean(1)),
            Signal("angular", a1.mean(0), "angular distance (block size 1) per scoring prompt",
                   lambda idx: a1[idx].mean(1))]


def signal_context(ck, corpus, evaluator, memo, names, calib_tokens=None, unit: str = "block", should_stop=None):
    """The method context the registry signals ``names`` run in on checkpoint ``ck``: the plan of every layer, no
    spacing, the run's ``calib_tokens`` for each calibration method (:class:`~swapkl.removal.plan.RemovalPlan`
    with ``exclude_boundary=False``, ``spacing=0``), through the plan's one constructor
    (:meth:`~swapkl.removal.plan.CheckedPlan.context`)."""
    from swapkl.removal.plan import RemovalPlan, RunHooks

    plan = RemovalPlan(budget=1, methods=tuple(names), unit=unit, spacing=0, exclude_boundary=False,
                       evaluator=evaluator, calib_tokens=calib_tokens)
    return plan.check(ck.num_layers, {}).context(ck.model, ck.tokenizer, RunHooks(should_stop=should_stop),
                                                 corpus=corpus, evaluator=evaluator, memo=memo)


def registry_signals(ctx, L: int, names=("bi", "cka", "taylor", "sleb")) -> list[Signal]:
    """The registry methods' own per-layer scores on calibration text (``ctx``: a
    :class:`~swapkl.removal.methods.MethodContext`)."""
    from swapkl.removal import methods as M

    if "sleb" in names:
        prefill_sleb(ctx, M.calib_tokens(ctx, "sleb"))
    out = []
    for name in names:
        info = M.get(name).func(ctx, 1).info
        if name == "sleb":
            trials = info["steps"][0]["trials"]
            v = np.array([trials.get(str(i), np.nan) for i in range(L)], dtype=float)
            out.append(Signal("sleb", v, "SLEB first step: calibration PPL without the layer"))
        elif name == "cka":
            out.append(Signal("cka", 1.0 - np.asarray(info["cka"], float), "1 - linear CKA (calibration text)"))
        else:
            out.append(Signal(name, np.asarray(info[name], float), f"{name} (calibration text)"))
    return out


def prefill_sleb(ctx, max_tokens: int) -> None:
    """Put the calibration PPL of the base model and of every single removal into ``ctx.memo`` under the keys
    ``MethodContext.calib_ppl`` uses, computed by one prefix-reuse sweep
    (:func:`swapkl.evidence.ground_truth.single_removal_sweep`, equal to the plain evaluations): SLEB's first step
    then reads them instead of running L evaluations.  Entries already in the memo are kept."""
    from swapkl.evidence.ground_truth import single_removal_sweep

    if getattr(ctx, "unit", "block") != "block":  # the sweep removes blocks; a sublayer's trials run one by one
        return
    ids = ctx.calib_ids(max_tokens)
    win = min(ctx.evaluator.window, ids.numel())
    key = f"calib:{getattr(ctx.corpus, 'sha256', '?')}:{ids.numel()}:{win}"
    missing = [i for i in range(ctx.num_layers) if ctx.memo.peek(key, [i]) is None]
    if not missing:
        return
    sw = single_removal_sweep(ctx.model, ids, win, win, layers=missing, kl=False, should_stop=ctx.should_stop)
    ctx.memo.get(key, [], lambda: sw.baseline)
    for i, r in sw.removed.items():
        ctx.memo.get(key, [i], lambda r=r: r)


def bridged_kl_signal(br, num_layers: int) -> Signal:
    """``bridged_kl`` from a :class:`~swapkl.repair.bridged_kl.BridgedResult` holding the spans ``[ℓ, ℓ+1)``: the
    mean over prompts of KL(base ‖ block ℓ bridged) (nats), resampled per prompt (idx (B, P) → (B, L))."""
    P = len(next(iter(br.spans.values()))["bridged"])
    V = np.full((num_layers, P), np.nan)
    for ell in range(num_layers):
        if (ell, ell + 1) in br.spans:
            V[ell] = np.asarray(br.spans[(ell, ell + 1)]["bridged"], float)
    return Signal(SIGNAL_BRIDGED, V.mean(1), f"KL(base ‖ block bridged), span [l, l+1), {P} scoring prompts",
                  (lambda idx: V[:, idx].mean(-1).T) if P > 1 else None)
