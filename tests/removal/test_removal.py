"""Selection rule (hand-worked), budget errors, random sets, regime verdict, and the memoised curves runner."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.errors import ComputeInterrupted
from swapkl.removal.selection import BudgetError, layer_scores, max_feasible, random_sets, select
from swapkl.removal.checks import ScoresMismatch
from swapkl.removal.curves import CurvesResult, removal_curves
from swapkl.measure.memo import EvalMemo
from swapkl.scoring.verdict import regime_verdict
from swapkl.removal.plan import RemovalPlan, RunHooks

NAN = np.nan




def sym(L, pairs):
    d = np.full((L, L), NAN)
    for (i, j), v in pairs.items():
        d[i, j] = d[j, i] = v
    return d


# d(0,1)=.9 d(1,2)=.2 d(2,3)=.05 d(3,4)=.3 d(4,5)=.4 and one gap-2 pair d(1,3)=.01
D6 = sym(6, {(0, 1): 0.9, (1, 2): 0.2, (2, 3): 0.05, (3, 4): 0.3, (4, 5): 0.4, (1, 3): 0.01})


def test_layer_scores_by_hand():
    s = layer_scores(D6)
    np.testing.assert_allclose(s, [0.9, 0.01, 0.05, 0.01, 0.3, 0.4])
    np.testing.assert_allclose(layer_scores(D6, partners="adjacent"), [0.9, 0.2, 0.05, 0.05, 0.3, 0.4])
    upper = np.triu(np.nan_to_num(D6, nan=0.0), 1)
    upper[upper == 0] = NAN  # only one triangle stored
    np.testing.assert_allclose(layer_scores(upper), s)
    assert np.isnan(layer_scores(sym(3, {(0, 1): 0.5}))[2])  # no scored partner


def test_select_by_hand():
    # all partners: s = 1:.01 3:.01 2:.05 4:.3 -> order 1,3,2,4 ; Δ=1 keeps 1, 3
    assert select(D6, 2) == [[1], [1, 3]]
    # adjacent partners: order 2 (.05), 3 (.05, tie -> index), 1 (.2), 4 (.3) -> 2, then 4
    assert select(D6, 2, partners="adjacent") == [[2], [2, 4]]
    # Δ=0: no spacing
    assert select(D6, 4, spacing=0, partners="adjacent") == [[2], [2, 3], [1, 2, 3], [1, 2, 3, 4]]
    # boundary allowed: order 1,3,2,4,5,0 -> 1,3,5
    assert select(D6, 3, exclude_boundary=False) == [[1], [1, 3], [1, 3, 5]]
    # anti-guided: highest first, 4 (.3), 2 (.05), then 1/3 too close
    assert select(D6, 2, anti=True) == [[4], [2, 4]]
    # explicit candidates
    assert select(D6, 1, candidates=[2, 4]) == [[2]]
    # ties broken by index
    assert select(np.ones((6, 6)), 2) == [[1], [1, 3]]


def test_max_feasible_and_budget_errors():
    assert max_feasible([1, 2, 3, 4], 1) == 2
    assert max_feasible([1, 2, 3, 4], 0) == 4
    assert max_feasible([1, 2, 3, 4], 2) == 2
    assert max_feasible(range(1, 29), 1) == 14
    with pytest.raises(BudgetError, match=r"budget 3 is larger .* at most 2 of 4 candidates .* spacing Δ=1"):
        select(D6, 3)
    with pytest.raises(BudgetError, match="at least 1"):
        select(D6, 0)
    # feasible budget, but the score order gets stuck: 2 first blocks both 1 and 3
    d5 = sym(5, {(0, 1): 1.0, (1, 2): 0.5, (2, 3): 0.1, (3, 4): 1.0})
    with pytest.raises(BudgetError, match=r"stops after 1 layers \[2\]"):
        select(d5, 2)
    assert select(d5, 2, strict=False) == [[2]]


def test_random_sets():
    cands = list(range(1, 29))
    for seed in range(5):
        sets = random_sets(cands, 14, spacing=1, seed=seed)
        assert len(sets) == 14 and all(len(s) == k + 1 for k, s in enumerate(sets))
        assert all(set(a) < set(b) for a, b in zip(sets, sets[1:]))  # nested
        assert all(b - a > 1 for a, b in zip(sets[-1], sets[-1][1:]))  # spacing
    assert random_sets(cands, 5, seed=3) == random_sets(cands, 5, seed=3)
    assert len({tuple(random_sets(cands, 3, seed=s)[-1]) for s in range(5)}) > 1
    with pytest.raises(BudgetError):
        random_sets([1, 2, 3], 3, spacing=1)


def mat4(adj):
    return sym(4, {(0, 1): adj[0], (1, 2): adj[1], (2, 3): adj[2], (0, 3): 0.0})  # a non-adjacent pair is ignored


def test_regime_verdict_by_hand():
    v = regime_verdict(mat4([0.3, 0.2, 0.5]), mat4([0.05, 0.08, 0.3]))
    assert v["regime"] == "divergent" and v["prefer"] == "interchange"
    ev = v["evidence"]
    assert ev["replacement"]["below_threshold"] == 0 and ev["interchange"]["below_threshold"] == 2
    assert ev["interchange"]["below_0.05"] == 0  # 0.05 is not < 0.05
    assert ev["replacement"]["median"] == pytest.approx(0.3) and ev["interchange"]["median"] == pytest.approx(0.08)
    assert ev["kl_ratio_best"] == pytest.approx(0.05 / 0.2)
    assert ev["kl_ratio_median"] == pytest.approx(0.4)
    assert ev["interchange"]["best_pair"] == [0, 1]
    assert regime_verdict(mat4([0.04, 0.2, 0.5]), mat4([0.03, 0.2, 0.3]))["regime"] == "tied"
    w = regime_verdict(mat4([0.4, 0.2, 0.5]), mat4([0.15, 0.2, 0.3]))
    assert w["regime"] == "weak" and "0.15" in w["sentence"]
    inv = regime_verdict(mat4([0.04, 0.2, 0.5]), mat4([0.15, 0.2, 0.3]))
    assert inv["regime"] == "divergent" and inv["prefer"] == "replacement"
    with pytest.raises(Exception, match="adjacent"):
        regime_verdict(sym(4, {(0, 2): 0.1}), sym(4, {(0, 2): 0.1}))


# ------------------------------------------------------------------------------------------------ curves
def scores5():
    # replacement: layer 1 lowest, then 3 -> [1], [1,3];  interchange: 3 lowest, then 1 -> [3], [1,3]
    r = sym(5, {(0, 1): 0.05, (1, 2): 0.4, (2, 3): 0.3, (3, 4): 0.2})
    i = sym(5, {(0, 1): 0.09, (1, 2): 0.3, (2, 3): 0.2, (3, 4): 0.02})
    return {"replacement": r, "interchange": i}


def test_curves_runner(stories_hf):
    from swapkl.measure.evaluate import Evaluator, delta_pct, eval_ids, evaluate_ppl
    from swapkl.surgery.prune import pruned_copy

    model, tok, corpus = stories_hf
    ev = Evaluator("tiny", 200, 128, 64)
    memo = EvalMemo()
    calls = []
    plan = RemovalPlan(budget=2, methods=["replacement", "interchange", "random", "anti"], evaluator=ev)
    r = removal_curves(model, tok, scores5(), plan,
                       RunHooks(corpus=corpus, memo=memo, progress=lambda d, t, msg: calls.append((d, t, msg))))
    # ends at done == total, the plan's expected evaluations (an upper bound here: the random seeds' sets coincide)
    assert calls[-1][:2] == (plan.expected_evaluations(5, scores5()),) * 2 and memo.misses <= calls[-1][1]
    assert all(d <= t for d, t, _ in calls) and [d for d, _, _ in calls] == sorted(d for d, _, _ in calls)
    assert r.complete and r.methods["replacement"][0]["removed"] == [1]
    assert [e["removed"] for e in r.methods["replacement"]] == [[1], [1, 3]]
    assert [e["removed"] for e in r.methods["interchange"]] == [[3], [1, 3]]
    # the only feasible 2-sets under Δ=1 on candidates 1..3 is {1,3}: anti and every random seed end there
    assert all(e["removed"] == [1, 3] for e in r.random_seeds["random"]["0"][1:])
    assert set(r.methods) == {"replacement", "interchange", "random", "anti-replacement", "anti-interchange"}
    # numbers: PPL equals a direct evaluation, ΔPPL% vs the same-run baseline, KL >= 0
    ids = eval_ids(corpus, tok, ev)
    direct = evaluate_ppl(pruned_copy(model, [1, 3]), ids, 128, 64)
    base = evaluate_ppl(model, ids, 128, 64)
    e = r.methods["replacement"][1]
    assert e["ppl"] == pytest.approx(direct.ppl, rel=1e-6)
    assert r.baseline_ppl == pytest.approx(base.ppl, rel=1e-6)
    assert e["delta_pct"] == pytest.approx(delta_pct(direct, base), rel=1e-6)
    assert e["ppl_ci"][0] < e["ppl"] < e["ppl_ci"][1] and e["delta_pct_ci"][0] <= e["delta_pct"] <= e["delta_pct_ci"][1]
    assert e["kl_to_base"] > 0
    # memo: each distinct removed set is evaluated once ({1}, {2}, {3}, {1,3}) however many methods pick it
    assert r.stats["evaluations"] == 4
    rnd = r.methods["random"][0]
    assert rnd["n_seeds"] == 5 and rnd["delta_pct_min"] <= rnd["delta_pct"] <= rnd["delta_pct_max"]
    # ΔPPL ratio and verdict
    assert r.delta_ratio[0]["ratio"] == pytest.approx(r.methods["interchange"][0]["delta_pct"] /
                                                      r.methods["replacement"][0]["delta_pct"])
    assert r.delta_ratio[1]["ratio"] == pytest.approx(1.0)
    assert r.verdict["regime"] == "tied"
    # JSON round trip
    back = CurvesResult.from_json(r.to_json())
    assert json.loads(back.to_json()) == json.loads(r.to_json())
    # a second call on the same memo re-uses everything
    r2 = removal_curves(model, tok, scores5(), RemovalPlan(budget=2, methods=["replacement", "interchange"], evaluator=ev),
                        RunHooks(corpus=corpus, memo=memo))
    assert r2.stats["evaluations"] == 0 and r2.methods["replacement"] == r.methods["replacement"]


def test_curves_bad_input(stories_hf):
    from swapkl.measure.evaluate import Evaluator

    model, tok, corpus = stories_hf
    ev = Evaluator("tiny", 200, 128, 64)
    with pytest.raises(BudgetError, match="at most 2"):
        removal_curves(model, tok, scores5(), RemovalPlan(budget=3, methods=["replacement"], evaluator=ev),
                       RunHooks(corpus=corpus))
    with pytest.raises(ScoresMismatch, match="6-layer model; this model has 5"):
        removal_curves(model, tok, {"replacement": np.zeros((6, 6))}, RemovalPlan(budget=1, methods=["replacement"], evaluator=ev),
                       RunHooks(corpus=corpus))
    with pytest.raises(Exception, match="unknown method nope; available:"):
        removal_curves(model, tok, scores5(), RemovalPlan(budget=1, methods=["nope"], evaluator=ev),
                       RunHooks(corpus=corpus))
    with pytest.raises(Exception, match="needs interchange scores"):
        removal_curves(model, tok, {"replacement": scores5()["replacement"]}, RemovalPlan(budget=1, methods=["interchange"], evaluator=ev),
                       RunHooks(corpus=corpus))
    with pytest.raises(ComputeInterrupted) as ei:
        calls = iter(range(100))
        removal_curves(model, tok, scores5(), RemovalPlan(budget=2, methods=["replacement", "interchange"], evaluator=ev),
                       RunHooks(corpus=corpus, should_stop=lambda: next(calls) > 6))
    assert ei.value.partial is not None and not ei.value.partial.complete


def test_literature_baselines_not_bound_by_the_rule(stories_hf):
    """SLEB/BI choose from every layer: a budget beyond the rule's maximum (2) is fine for them alone."""
    from swapkl.measure.evaluate import Evaluator

    model, tok, corpus = stories_hf
    r = removal_curves(model, tok, None, RemovalPlan(budget=3, methods=["bi"], evaluator=Evaluator("tiny", 200, 128, 64), kl=False, method_params={"bi": {"calib_tokens": 256}}),
                       RunHooks(corpus=corpus))
    assert [len(e["removed"]) for e in r.methods["bi"]] == [1, 2, 3]
    with pytest.raises(BudgetError, match="at most 2"):
        removal_curves(model, tok, None, RemovalPlan(budget=3, methods=["bi", "random"], evaluator=Evaluator("tiny", 200, 128, 64)),
                       RunHooks(corpus=corpus))
