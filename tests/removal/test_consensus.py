"""The consensus of the two protocols (docs/consensus.md, swapkl.scoring.consensus and the consensus methods)
against a plain hand computation: ranks counted with loops, the order sorted by hand, the walk with spacing."""
from __future__ import annotations

import numpy as np
import pytest

from swapkl.removal import methods as M
from swapkl.removal.methods.consensus import consensus_sets
from swapkl.removal.selection import layer_scores
from swapkl.scoring.consensus import candidate_ranks, consensus_order, consensus_scores


def _plain_ranks(s, cands):
    """Average ranks by counting: 1 + (number strictly below) + (number equal − 1) / 2."""
    out = [float("nan")] * len(s)
    vals = [s[c] for c in cands]
    for c in cands:
        below = sum(v < s[c] for v in vals)
        equal = sum(v == s[c] for v in vals)
        out[c] = 1 + below + (equal - 1) / 2
    return out


def _plain_walk(order, n, spacing):
    picked = []
    for i in order:
        if len(picked) < n and all(abs(i - j) > spacing for j in picked):
            picked.append(i)
    return [sorted(picked[:k]) for k in range(1, len(picked) + 1)]


def _matrix(rng, L):
    d = rng.random((L, L))
    d = np.triu(d, 1)
    d[d == 0] = np.nan
    return d


@pytest.mark.parametrize("seed", range(6))
def test_orders_and_sets_match_a_plain_computation(seed):
    rng = np.random.default_rng(seed)
    L = 9
    d_r, d_i = _matrix(rng, L), _matrix(rng, L)
    if seed % 2:  # ties: rounded scores
        d_r, d_i = np.round(d_r, 1), np.round(d_i, 1)
    cands = list(range(1, L - 1))
    s_r, s_i = layer_scores(d_r), layer_scores(d_i)
    r_r, r_i = _plain_ranks(s_r, cands), _plain_ranks(s_i, cands)
    np.testing.assert_allclose(candidate_ranks(s_r, cands)[cands], [r_r[c] for c in cands])
    mean = {c: (r_r[c] + r_i[c]) / 2 for c in cands}
    big = {c: max(r_r[c], r_i[c]) for c in cands}
    assert consensus_order(s_r, s_i, cands, "mean") == sorted(cands, key=lambda c: (mean[c], big[c], c))
    assert consensus_order(s_r, s_i, cands, "max") == sorted(cands, key=lambda c: (big[c], mean[c], c))
    np.testing.assert_allclose(consensus_scores(s_r, s_i, cands, "max")[cands], [big[c] for c in cands])
    assert np.isnan(consensus_scores(s_r, s_i, cands, "mean")[0])  # not a candidate
    for rule, key in (("mean", lambda c: (mean[c], big[c], c)), ("max", lambda c: (big[c], mean[c], c))):
        for spacing in (0, 1, 2):
            n = 2 if spacing == 2 else 3
            assert consensus_sets(d_r, d_i, n, rule, spacing, cands) == _plain_walk(sorted(cands, key=key), n, spacing)


def test_agreeing_protocols_give_their_own_order_and_the_conservative_rule_waits_for_both():
    s_r = np.array([np.nan, 0.1, 0.2, 0.3, 0.4, np.nan])
    assert consensus_order(s_r, s_r * 0.3, [1, 2, 3, 4], "mean") == [1, 2, 3, 4]
    # layer 1 is safest for replacement and riskiest for interchange: the conservative rule takes it last
    s_i = np.array([np.nan, 0.9, 0.1, 0.2, 0.3, np.nan])
    # ranks R (1, 2, 3, 4), I (4, 1, 2, 3): larger ranks (4, 2, 3, 4), mean ranks (2.5, 1.5, 2.5, 3.5)
    assert consensus_order(s_r, s_i, [1, 2, 3, 4], "max") == [2, 3, 1, 4]
    assert consensus_order(s_r, s_i, [1, 2, 3, 4], "mean") == [2, 3, 1, 4]  # 1 and 3 tie at 2.5: the smaller larger rank (3) first


def test_registered_with_both_needs_and_in_the_study_set():
    for name in ("consensus-mean", "consensus-max"):
        spec = M.get(name)
        assert set(spec.needs) == {"replacement", "interchange"}
    with pytest.raises(Exception, match="needs interchange"):
        M.resolve(["consensus-mean"], {"replacement": np.zeros((3, 3))})
    assert {"consensus-mean", "consensus-max"} <= set(M.default_set("study"))


def test_curves_run_the_consensus_on_stories(stories_hf):
    from swapkl.measure.evaluate import Evaluator
    from swapkl.removal.curves import removal_curves
    from swapkl.removal.plan import RemovalPlan, RunHooks

    model, tok, corpus = stories_hf
    rng = np.random.default_rng(1)
    scores = {"replacement": _matrix(rng, 5), "interchange": _matrix(rng, 5)}
    r = removal_curves(model, tok, scores, RemovalPlan(budget=1, methods=["consensus-mean", "consensus-max"],
                                                       evaluator=Evaluator("tiny", 200, 128, 64), kl=False),
                       RunHooks(corpus=corpus))
    s_r, s_i = layer_scores(scores["replacement"]), layer_scores(scores["interchange"])
    for name, rule in (("consensus-mean", "mean"), ("consensus-max", "max")):
        assert r.methods[name][0]["removed"] == [consensus_order(s_r, s_i, [1, 2, 3], rule)[0]]
        assert np.isfinite(r.methods[name][0]["ppl"])
