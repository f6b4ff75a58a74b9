"""RemovalPlan: one frozen plan per removal run, checked in one place (one-line errors), recorded in the result, with
the one ``expected_evaluations()``; the runner publishes each curve once (``on_curve``) and the dashboard's pipeline
runs the curves once, not once per method prefix."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from swapkl.errors import SwapklError
from swapkl.removal.curves import CurvesResult, removal_curves
from swapkl.measure.evaluate import Evaluator, eval_ids, evaluate_ppl
from swapkl.measure.memo import EvalMemo
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.removal.selection import BudgetError
from swapkl.surgery.prune import pruned_copy

EV = Evaluator("tiny", 200, 128, 64)


def sym(L, pairs):
    d = np.full((L, L), np.nan)
    for (i, j), v in pairs.items():
        d[i, j] = d[j, i] = v
    return d


def scores5():
    """Replacement picks layer 1 then 3; interchange 3 then 1 (5 layers, candidates 1..3, Δ=1)."""
    return {"replacement": sym(5, {(0, 1): 0.05, (1, 2): 0.4, (2, 3): 0.3, (3, 4): 0.2}),
            "interchange": sym(5, {(0, 1): 0.09, (1, 2): 0.3, (2, 3): 0.2, (3, 4): 0.02})}


# ----------------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize("fields,message", [
    ({"budget": 0}, r"budget must be an integer of at least 1 \(got 0\)"),
    ({"budget": True}, "budget must be an integer"),
    ({"budget": 2, "methods": ["nope"]}, "unknown method nope; available:"),
    ({"budget": 2, "methods": ["replacement", ""]}, "methods must be non-empty names"),
    ({"budget": 2, "unit": "ffn"}, "unknown unit 'ffn'; choose one of: block, attention, mlp"),
    ({"budget": 2, "spacing": -1}, r"spacing Δ must be an integer of at least 0 \(got -1\)"),
    ({"budget": 2, "seeds": ()}, "seeds must name at least one seed"),
    ({"budget": 2, "seeds": (0, -3)}, "a seed must be an integer of at least 0"),
    ({"budget": 2, "partners": "far"}, "partners must be adjacent, all, an integer K"),
    ({"budget": 2, "repair": "lora"}, "unknown repair 'lora'; choose one of: none"),
    ({"budget": 2, "method_params": {"bi": 3}}, r"method_params must be \{method: \{option: value\}\}"),
    ({"budget": 2, "batch_size": 0}, "batch_size must be an integer of at least 1"),
    ({"budget": 2, "evaluator": 3}, "evaluator must be a name, an Evaluator or its settings"),
])
def test_constructor_refuses_in_one_line(fields, message):
    with pytest.raises(SwapklError, match=message) as e:
        RemovalPlan(**fields)
    assert "\n" not in str(e.value)


def test_plan_is_frozen_normalised_and_recorded():
    params = {"bi": {"calib_tokens": 128, "layers": [1, 2]}}
    p = RemovalPlan(3, ["interchange", "replacement", "interchange"], partners=[[1, 2]], seeds=range(2),
                    candidates=[3, 1, 1], method_params=params, evaluator=EV)
    assert p.methods == ("interchange", "replacement") and p.seeds == (0, 1) and p.candidates == (1, 3)
    assert p.partners == ((1, 2),) and p.repair == "none"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.budget = 4
    with pytest.raises(TypeError):
        p.method_params["bi"]["calib_tokens"] = 1  # read-only all the way down
    params["bi"]["calib_tokens"] = 1  # the caller's dict is copied, not shared
    mine = p.params()
    mine["bi"]["layers"].append(9)  # a writable copy: the plan stays as it is
    assert p.params() == {"bi": {"calib_tokens": 128, "layers": [1, 2]}}
    d = p.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d == {"budget": 3, "methods": ["interchange", "replacement"], "unit": "block", "spacing": 1,
                 "exclude_boundary": True, "candidates": [1, 3], "partners": [[1, 2]], "seeds": [0, 1],
                 "evaluator": EV.to_dict(), "calib_tokens": None, "method_params": p.params(), "batch_size": None,
                 "kl": True, "repair": "none", "bridge": {}}
    assert RemovalPlan(2).methods  # no methods: the dashboard's default set
    assert p.with_(budget=1).budget == 1 and p.budget == 3
    with pytest.raises(SwapklError, match="budget"):
        p.with_(budget=0)


# ------------------------------------------------------------------------------------------ against one model
def test_check_against_the_model_refuses_in_one_line():
    s = scores5()
    with pytest.raises(BudgetError, match="budget 3 is larger than the candidate layers allow: at most 2"):
        RemovalPlan(3, ["replacement"]).check(5, s)
    with pytest.raises(SwapklError, match=r"candidate layer\(s\) \[7\] out of range 0..4"):
        RemovalPlan(1, ["replacement"], candidates=[1, 7]).check(5, s)
    with pytest.raises(SwapklError, match="needs interchange scores"):
        RemovalPlan(1, ["interchange"]).check(5, {"replacement": s["replacement"]})
    with pytest.raises(SwapklError, match="6-layer model; this model has 5"):
        RemovalPlan(1, ["replacement"]).check(5, {"replacement": np.zeros((6, 6))})
    with pytest.raises(SwapklError, match=r"method\(s\) cka remove whole blocks only; for --unit mlp"):
        RemovalPlan(1, ["cka"], unit="mlp").check(5, s)
    # literature baselines choose their own candidates: a budget beyond the rule's 2 is fine for them alone
    RemovalPlan(3, ["bi"]).check(5)
    c = RemovalPlan(2, ["anti", "random"], seeds=[4]).check(5, s)
    assert [x.name for x in c.specs] == ["anti-replacement", "anti-interchange", "random"]
    assert c.candidates == [1, 2, 3] and c.seeds == [4]


def test_expected_evaluations_by_hand():
    s = scores5()
    # baseline + the distinct guided sets {1}, {3}, {1,3}: the two methods share {1,3}
    assert RemovalPlan(2, ["replacement", "interchange"]).expected_evaluations(5, s) == 1 + 3
    # a seeded method counts its seeds' sets
    assert RemovalPlan(1, ["replacement", "random"], seeds=[0, 1, 2]).expected_evaluations(5, s) >= 1 + 1


# ----------------------------------------------------------------------------------------------- the runner
def test_expected_evaluations_equal_the_evaluations_run(stories, corpus):
    """On a fresh memo, the plan's count is what the run evaluates (memo misses), and progress ends at it."""
    plan = RemovalPlan(2, ["replacement", "interchange", "anti"], evaluator=EV, kl=False)
    memo, seen = EvalMemo(), []
    r = removal_curves(stories.model, stories.tokenizer, scores5(), plan,
                       RunHooks(corpus=corpus, memo=memo, progress=lambda d, t, m: seen.append((d, t))))
    expected = plan.expected_evaluations(stories.num_layers, scores5())
    assert memo.misses == r.stats["evaluations"] + 1 == expected  # + the baseline
    assert seen[-1] == (expected, expected) and all(t == expected for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_on_curve_once_per_method_in_order_and_values_equal_a_plain_evaluation(stories, corpus):
    calls = []
    plan = RemovalPlan(2, ["interchange", "replacement", "random"], evaluator=EV, seeds=range(5))
    r = removal_curves(stories.model, stories.tokenizer, scores5(), plan,
                       RunHooks(corpus=corpus, memo=EvalMemo(),
                                on_curve=lambda name, partial: calls.append((name, partial))))
    assert [n for n, _ in calls] == ["interchange", "replacement", "random"]
    for k, (name, partial) in enumerate(calls):
        assert list(partial.methods) == [n for n, _ in calls[:k + 1]] and not partial.complete
        assert partial.methods[name] == r.methods[name]
    assert r.complete and r.plan == plan.to_dict()
    assert CurvesResult.from_json(r.to_json()).plan == plan.to_dict()  # recorded and read back
    # the numbers: a plain evaluation of the pruned copy on the evaluator's text
    ids = eval_ids(corpus, stories.tokenizer, EV)
    base = evaluate_ppl(stories.model, ids, EV.window, EV.stride)
    assert r.baseline_ppl == pytest.approx(base.ppl, rel=1e-6)
    for name in ("interchange", "replacement"):
        for e in r.methods[name]:
            plain = evaluate_ppl(pruned_copy(stories.model, e["removed"]), ids, EV.window, EV.stride)
            assert e["ppl"] == pytest.approx(plain.ppl, rel=1e-6), (name, e["removed"])
    assert [e["removed"] for e in r.methods["replacement"]] == [[1], [1, 3]]


def test_dashboard_pipeline_runs_the_curves_once(stories, corpus, cache_dir, monkeypatch):
    """run_curves calls removal_curves once (no re-run per method prefix), guided methods first, each curve shown
    as it finishes, progress total from the plan."""
    from swapkl.contract import Contract
    from swapkl.jobs import pipelines
    from swapkl.jobs.requests import AnalysisRequest

    runs, shown, ticks = [], [], []
    real = pipelines.removal_curves

    def counting(*a, **k):
        runs.append(a[3])
        return real(*a, **k)

    class FakeJob:
        def __init__(self, req):
            self.request = req

        def __setattr__(self, key, value):
            if key == "curves":
                shown.append(list(value.methods))
            object.__setattr__(self, key, value)

        def tick(self, done, total, what):
            ticks.append((done, total))

        def should_stop(self):
            return False

    monkeypatch.setattr(pipelines, "removal_curves", counting)
    monkeypatch.setattr(pipelines, "load_corpus", lambda spec=None: corpus)
    req = AnalysisRequest(model="stories", contract=Contract(), budget=2, evaluator=EV,
                          methods=("random", "replacement", "interchange"))
    res = SimpleNamespace(replacement=lambda: scores5()["replacement"], interchange=lambda: scores5()["interchange"],
                          protocol_scores=lambda: {k: scores5()[k] for k in ("replacement", "interchange")})
    job = FakeJob(req)
    pipelines.run_curves(job, stories, res)
    assert len(runs) == 1 and runs[0].methods == ("replacement", "interchange", "random")
    assert shown == [["replacement"], ["replacement", "interchange"], ["replacement", "interchange", "random"],
                     ["replacement", "interchange", "random"]]  # one per curve, then the finished result
    assert job.curves.complete
    assert ticks[0] == (0, runs[0].expected_evaluations(stories.num_layers, scores5()))
    assert ticks[-1][0] == ticks[-1][1]


def test_form_refuses_a_bad_plan_in_one_line():
    from swapkl.contract import Contract
    from swapkl.jobs.forms import analysis_request

    with pytest.raises(SwapklError, match="unknown method nope"):
        analysis_request("default", None, Contract(), 2, ("nope",), None)
    req = analysis_request("default", None, Contract(unit="attention"), 2, ("cka", "interchange", "bi"), None)
    assert req.removal_plan().methods == ("interchange", "bi") and req.removal_plan().unit == "attention"
