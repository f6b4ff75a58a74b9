"""Removal with repair (``RemovalPlan(repair="bridge")``): the plan's bridge settings and refusals, every bridged curve
point against a plain implementation (deep copy, bridges fitted by a plain ``numpy.linalg.lstsq`` on the same
calibration activations, the same evaluation), raw points unchanged, the paired CI against a plain paired bootstrap,
the exact progress total, the calibration text's disjointness, and the result's schema round trip."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support.bridge_plain import plain_activations, plain_bridged
from swapkl.errors import SwapklError
from swapkl.removal.curves import CurvesResult, removal_curves
from swapkl.measure.evaluate import Evaluator, delta_pct, eval_ids, evaluate_ppl
from swapkl.measure.memo import EvalMemo
from swapkl.removal.plan import BRIDGE_DEFAULTS, RemovalPlan, RunHooks

EV = Evaluator("tiny", 200, 128, 64)
BRIDGE = {"calib_tokens": 1024, "calib_window": 64, "ridge": 0.0}


def sym(L, pairs):
    d = np.full((L, L), np.nan)
    for (i, j), v in pairs.items():
        d[i, j] = d[j, i] = v
    return d


def scores5():
    """Replacement picks layer 1 then 3; interchange 3 then 1 (5 layers, candidates 1..3, Δ=1)."""
    return {"replacement": sym(5, {(0, 1): 0.05, (1, 2): 0.4, (2, 3): 0.3, (3, 4): 0.2}),
            "interchange": sym(5, {(0, 1): 0.09, (1, 2): 0.3, (2, 3): 0.2, (3, 4): 0.02})}


@pytest.fixture(scope="module")
def runs(stories, corpus):
    """The same plan run raw only and with the bridge (fresh memos), and the bridged run's progress ticks."""
    ticks = []
    plan = RemovalPlan(2, ["replacement", "interchange"], evaluator=EV)
    raw = removal_curves(stories.model, stories.tokenizer, scores5(), plan, RunHooks(corpus=corpus, memo=EvalMemo()))
    memo = EvalMemo()
    bridged = removal_curves(stories.model, stories.tokenizer, scores5(), plan.with_(repair="bridge", bridge=BRIDGE),
                             RunHooks(corpus=corpus, memo=memo, progress=lambda d, t, m: ticks.append((d, t))))
    return raw, bridged, memo, ticks, plan.with_(repair="bridge", bridge=BRIDGE)


# ----------------------------------------------------------------------------------------------- the plan
@pytest.mark.parametrize("fields,message", [
    ({"repair": "bridge", "bridge": {"form": "diagonal"}}, "unknown bridge form 'diagonal'; choose one of: folded"),
    ({"repair": "bridge", "bridge": {"calib_tokens": 8}}, "calibration tokens must be an integer of at least 16"),
    ({"repair": "bridge", "bridge": {"ridge": -1.0}}, r"ridge must be a finite number >= 0 \(got -1.0\)"),
    ({"repair": "bridge", "bridge": {"calib_tokens": 64, "calib_window": 128}}, r"tokens \(64\) must be at least"),
    ({"repair": "bridge", "bridge": {"rank": 3}}, "unknown bridge setting.* rank; known: form, calib_tokens"),
    ({"bridge": {"form": "residual"}}, "bridge settings go with repair 'bridge'"),
    ({"repair": "bridge", "unit": "mlp"}, "--repair bridge replaces whole blocks.*use --unit block"),
])
def test_bridge_settings_refused_in_one_line(fields, message):
    with pytest.raises(SwapklError, match=message) as e:
        RemovalPlan(2, ["replacement"], **fields)
    assert "\n" not in str(e.value)


def test_plan_records_the_bridge_and_its_defaults_are_the_fits():
    from swapkl.repair.bridged_kl import BridgeSettings

    assert BRIDGE_DEFAULTS == BridgeSettings().to_dict()
    d = RemovalPlan(2, repair="bridge", bridge={"form": "residual", "ridge": 0}).to_dict()
    assert d["repair"] == "bridge" and d["bridge"] == {"form": "residual", "ridge": 0.0}
    assert RemovalPlan(2).to_dict()["bridge"] == {}


# ----------------------------------------------------------------------------------------------- the run
def _plain_point(stories, corpus, calib_ids, removed):
    """The bridged model of ``removed`` built plainly (folded spans: least squares on block i−1's MLP output) and
    evaluated on the run's evaluation ids."""
    ws = {}
    for i, j in _spans(removed):
        act = plain_activations(stories.model, calib_ids, {i, j}, proj=i - 1)
        x, y = act["m"], act[j] - act[i] + act["m"]
        ws[(i, j)] = np.linalg.lstsq(x, y, rcond=None)[0]
    m = plain_bridged(stories.model, ws, "folded")
    return evaluate_ppl(m, eval_ids(corpus, stories.tokenizer, EV), EV.window, EV.stride, EV.drop_first_target)


def _spans(removed):
    out = []
    for k in sorted(removed):
        if out and out[-1][1] == k:
            out[-1][1] = k + 1
        else:
            out.append([k, k + 1])
    return [tuple(s) for s in out]


def test_every_bridged_point_equals_a_plain_bridged_model(runs, stories, corpus):
    from swapkl.repair.bridger import Bridger

    _raw, r, _memo, _t, plan = runs
    calib_ids = Bridger(stories.model, stories.tokenizer, corpus, dict(plan.bridge)).calib.ids
    base = evaluate_ppl(stories.model, eval_ids(corpus, stories.tokenizer, EV), EV.window, EV.stride)
    assert set(r.repaired) == {"replacement", "interchange"}
    for name, entries in r.repaired.items():
        assert [e["removed"] for e in entries] == [e["removed"] for e in r.methods[name]]
        for e in entries:
            want = _plain_point(stories, corpus, calib_ids, e["removed"])
            assert e["ppl"] == pytest.approx(want.ppl, rel=1e-4)
            assert e["delta_pct"] == pytest.approx(delta_pct(want, base), rel=1e-4, abs=1e-3)
            assert set(e) >= {"n", "removed", "ppl", "ppl_ci", "delta_pct", "delta_pct_ci", "kl_to_base",
                              "paired_delta_pct", "paired_ci"}
    assert set(r.repair) >= {"kind", "settings", "fits"} and r.repair["kind"] == "bridge"
    assert set(r.repair["fits"]) == {"1-2", "3-4"} and r.repair["settings"]["ridge"] == 0.0


def test_raw_points_unchanged_by_the_repair(runs):
    raw, r, *_ = runs
    assert r.methods == raw.methods and r.baseline_ppl == raw.baseline_ppl
    assert raw.repaired == {} and raw.repair == {}


def test_paired_ci_equals_a_plain_paired_bootstrap(runs):
    _raw, r, memo, _t, _p = runs
    run_key = next(k for k, v in memo.store if "|bridge:" in k)
    text_key = run_key.split("|bridge:")[0]
    base = memo.store[(text_key, frozenset())]
    for e in r.repaired["replacement"]:
        b, w = memo.store[(run_key, frozenset(e["removed"]))], memo.store[(text_key, frozenset(e["removed"]))]
        rng = np.random.default_rng(0)
        idx = rng.integers(0, len(base.counts), size=(1000, len(base.counts)))
        diffs = []
        for row in idx:
            c, bn = base.counts[row].sum(), base.nll[row].sum()
            db = 100.0 * (np.exp((b.nll[row].sum() - bn) / c) - 1.0)
            dw = 100.0 * (np.exp((w.nll[row].sum() - bn) / c) - 1.0)
            diffs.append(db - dw)
        assert e["paired_ci"] == pytest.approx([np.percentile(diffs, 2.5), np.percentile(diffs, 97.5)], rel=1e-9)
        whole = lambda nll: 100.0 * (np.exp((nll.sum() - base.nll.sum()) / base.counts.sum()) - 1.0)
        assert e["paired_delta_pct"] == pytest.approx(whole(b.nll) - whole(w.nll), rel=1e-9)


def test_progress_total_equals_the_evaluations_with_repair(runs, stories):
    _raw, r, memo, ticks, plan = runs
    expected = plan.expected_evaluations(stories.num_layers, scores5())
    assert expected == 1 + 2 * 3  # the baseline, then {1}, {3}, {1, 3} raw and bridged
    assert memo.misses == r.stats["evaluations"] + 1 == expected
    assert ticks[-1] == (expected, expected) and all(t == expected for _, t in ticks)


def test_result_round_trips_and_old_files_load(runs):
    _raw, r, *_ = runs
    d = json.loads(r.to_json())
    back = CurvesResult.from_json(r.to_json())
    assert back.to_dict() == d
    old = {k: v for k, v in d.items() if k not in ("repaired", "repair")}
    assert CurvesResult.from_dict(old).repaired == {} and CurvesResult.from_dict(old).repair == {}


def test_calibration_disjoint_from_prompts_and_evaluation(stories, corpus):
    from swapkl.contract import Contract
    from swapkl.repair.bridger import Bridger

    b = Bridger(stories.model, stories.tokenizer, corpus, dict(BRIDGE), Contract(prompts=8, tokens=64))
    desc = b.prompts.description
    body = 64 - (1 if desc.get("bos") else 0)
    prompt_tokens = {t for s in desc["window_starts"] for t in range(int(s), int(s) + body)}
    calib_tokens = {t for s, e in b.calib.spans for t in range(s, e)}
    assert calib_tokens and not calib_tokens & prompt_tokens
    assert corpus.split_point > 0  # the evaluation words precede the prompt region whose stream both index


def test_a_calibration_that_would_overlap_is_refused_before_any_evaluation(stories, corpus):
    from swapkl.contract import Contract

    memo = EvalMemo()
    plan = RemovalPlan(1, ["replacement"], evaluator=EV, repair="bridge",
                       bridge={"calib_tokens": 10_000_000, "calib_window": 64})
    with pytest.raises(SwapklError, match="calibration windows of 64 tokens outside the scoring prompts") as e:
        removal_curves(stories.model, stories.tokenizer, scores5(), plan,
                       RunHooks(corpus=corpus, memo=memo, contract=Contract(prompts=8, tokens=64)))
    assert "\n" not in str(e.value) and memo.misses == 0


def test_common_axis_rows_hold_the_bridged_curves(runs):
    from swapkl.surgery.sizes import params_removed
    from swapkl.views.units import common_axis_rows

    _raw, r, *_ = runs
    rows = common_axis_rows([r])
    bridged = [x for x in rows if x["method"].endswith("+bridge")]
    assert len(bridged) == sum(len(v) for v in r.repaired.values())
    for x in bridged:  # folded bridges add no parameters: the same share as the raw set
        e = next(e for e in r.repaired[x["method"][:-len("+bridge")]] if e["n"] == x["n"])
        assert x["delta_pct"] == e["delta_pct"]
        want = 100.0 * params_removed(r.sizes, e["removed"]) / r.sizes["non_embedding"]
        assert x["params_removed_pct"] == pytest.approx(want)
    d = r.to_dict()
    D = 64  # stories260K's hidden size: a residual bridge over 1..1 adds D² parameters back
    d["repair"]["fits"]["1-2"] = dict(d["repair"]["fits"]["1-2"], form="residual", params_added=D * D)
    x = next(x for x in common_axis_rows([d]) if x["method"] == "replacement+bridge" and x["removed"] == [1])
    want = 100.0 * (params_removed(r.sizes, [1]) - D * D) / r.sizes["non_embedding"]
    assert x["params_removed_pct"] == pytest.approx(want)


def test_seeded_method_bridged_per_seed_and_averaged(stories, corpus):
    plan = RemovalPlan(1, ["random"], evaluator=EV, seeds=range(5), repair="bridge", bridge=BRIDGE)
    memo = EvalMemo()
    r = removal_curves(stories.model, stories.tokenizer, None, plan, RunHooks(corpus=corpus, memo=memo))
    (e,) = r.repaired["random"]
    key = next(k for k, _ in memo.store if "|bridge:" in k)
    text_key = key.split("|bridge:")[0]
    base = memo.store[(text_key, frozenset())]
    whole = lambda res: 100.0 * (np.exp((res.nll.sum() - base.nll.sum()) / base.counts.sum()) - 1.0)
    sets = [p["removed"] for p in r.methods["random"][0]["per_seed"]]
    bridged = [whole(memo.store[(key, frozenset(s))]) for s in sets]
    raw = [whole(memo.store[(text_key, frozenset(s))]) for s in sets]
    assert e["delta_pct"] == pytest.approx(np.mean(bridged), rel=1e-9)
    assert e["paired_delta_pct"] == pytest.approx(np.mean(bridged) - np.mean(raw), rel=1e-9)
    assert e["paired_ci"] is None and e["removed"] is None and [p["removed"] for p in e["per_seed"]] == sets
    assert CurvesResult.from_json(r.to_json()).repaired == json.loads(r.to_json())["repaired"]
