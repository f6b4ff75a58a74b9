"""A consensus of the replacement and interchange layer scores (docs/consensus.md): ranks combined, lower = safer.

Each rule is a class (:class:`RankMean`, :class:`RankMax`) found through :data:`RULES`; :func:`consensus_order`
turns two layer-score vectors into the order the guided walk takes.  Pure functions over numpy vectors.
"""
from __future__ import annotations

import numpy as np


def candidate_ranks(scores, candidates) -> np.ndarray:
    """(L,) ranks of ``scores`` (L,) among ``candidates`` (1 = lowest score; tied scores share their average rank,
    ``scipy.stats.rankdata(method="average")``); NaN outside the candidates and where the score is NaN."""
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=float)
    out = np.full(s.shape, np.nan)
    ok = [c for c in sorted(set(int(c) for c in candidates)) if 0 <= c < len(s) and np.isfinite(s[c])]
    if ok:
        out[ok] = rankdata(s[ok], method="average")
    return out


class ConsensusRule:
    """One way to combine the two protocols' candidate ranks ``r_R``, ``r_I`` (L,) into a score (L,), lower = safer
    (NaN where either rank is NaN), with a second score that breaks its ties."""

    name = ""
    method = ""  # the removal method that walks its order (swapkl.removal.methods.consensus)
    label = ""

    def combine(self, r_r: np.ndarray, r_i: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def tie_break(self, r_r: np.ndarray, r_i: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class RankMean(ConsensusRule):
    """``(r_R + r_I) / 2``; ties broken by the larger rank."""

    name, method, label = "mean", "consensus-mean", "consensus (rank mean)"

    def combine(self, r_r, r_i):
        return (r_r + r_i) / 2.0

    def tie_break(self, r_r, r_i):
        return np.maximum(r_r, r_i)


class RankMax(ConsensusRule):
    """``max(r_R, r_I)``: safe only if both protocols say so; ties broken by the mean rank."""

    name, method, label = "max", "consensus-max", "consensus (conservative)"

    def combine(self, r_r, r_i):
        return np.maximum(r_r, r_i)

    def tie_break(self, r_r, r_i):
        return (r_r + r_i) / 2.0


#: every consensus rule, by name
RULES: dict[str, ConsensusRule] = {r.name: r for r in (RankMean(), RankMax())}


def consensus_scores(s_r, s_i, candidates, rule: str) -> np.ndarray:
    """(L,) consensus score of rule ``rule`` (:data:`RULES`) from the layer scores ``s_r`` and ``s_i`` (L,) (nats,
    lower = safer) over ``candidates``; NaN outside them or where either protocol has no score."""
    r = RULES[rule]
    return r.combine(candidate_ranks(s_r, candidates), candidate_ranks(s_i, candidates))


def walk_scores(s_r, s_i, candidates, rule: str) -> np.ndarray:
    """(L,) one number per layer whose ascending order, ties by layer index, is :func:`consensus_order`'s: the
    consensus score plus its tie-break score times ``0.2 / (L + 1)`` (ranks step by 0.5, so a consensus score steps
    by at least 0.25 and the tie-break, at most L, never reorders it); NaN where the consensus is NaN.  What a
    signal of the consensus ranks, so that its sets are the consensus method's."""
    r = RULES[rule]
    r_r, r_i = candidate_ranks(s_r, candidates), candidate_ranks(s_i, candidates)
    return r.combine(r_r, r_i) + r.tie_break(r_r, r_i) * (0.2 / (len(r_r) + 1))


def consensus_order(s_r, s_i, candidates, rule: str) -> list[int]:
    """The candidates with both scores, safest first under ``rule``: ascending consensus score, then its tie-break
    score, then layer index (docs/consensus.md, step 3)."""
    r = RULES[rule]
    r_r, r_i = candidate_ranks(s_r, candidates), candidate_ranks(s_i, candidates)
    c, t = r.combine(r_r, r_i), r.tie_break(r_r, r_i)
    ok = [i for i in range(len(c)) if np.isfinite(c[i])]
    return sorted(ok, key=lambda i: (c[i], t[i], i))
