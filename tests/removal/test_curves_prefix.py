"""Prefix sharing in removal curves (swapkl.removal.curves, "_recording"): a removal set whose first removed block
is f runs only blocks f.. on the evaluation windows, from the hidden states the baseline recorded.  Every evaluation
of a run -- per-window NLL and KL sums -- is bit-identical to the plain path (nothing recorded: every set's pruned
copy evaluated in full), on every supported family and on stories260K, for blocks and sublayers; and each set's
numbers equal a plain ``evaluate_ppl`` of its ``pruned_copy``."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FAMILY_NAMES, tiny_model
from swapkl.removal import curves as C
from swapkl.measure import prefix
from swapkl.measure.evaluate import Evaluator, eval_ids, evaluate_ppl
from swapkl.measure.memo import EvalMemo
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.surgery.blocks import pruned_copy
from test_removal import scores5

# 4 windows: three of 64 tokens and a shorter last one (two window shapes, two batches of the first shape)
EV = Evaluator("tiny", 200, 64, 48)
METHODS = ("replacement", "interchange", "random", "anti")


def _run(model, ids, monkeypatch, share: bool, unit: str = "block"):
    memo = EvalMemo()
    monkeypatch.setattr(prefix, "CURVES_STATES_BYTES", prefix.CURVES_STATES_BYTES if share else 0)
    plan = RemovalPlan(budget=2, methods=METHODS, evaluator=EV, unit=unit)
    result = C.removal_curves(model, None, scores5(), plan, RunHooks(memo=memo, eval_ids=ids))
    return result, memo


def _same_evaluations(a: EvalMemo, b: EvalMemo) -> int:
    assert set(a.store) == set(b.store)
    for key, ra in a.store.items():
        rb = b.store[key]
        assert np.array_equal(ra.nll, rb.nll), key
        assert np.array_equal(ra.counts, rb.counts), key
        assert (ra.kl is None) == (rb.kl is None) and (ra.kl is None or np.array_equal(ra.kl, rb.kl)), key
    return len(a.store)


def _model_and_ids(kind, stories=None, corpus=None):
    if kind == "stories260K":
        return stories.model, eval_ids(corpus, stories.tokenizer, EV)
    g = torch.Generator().manual_seed(5)
    return tiny_model(kind, num_layers=5), torch.randint(1, 96, (230,), generator=g)


@pytest.mark.parametrize("kind", FAMILY_NAMES + ("stories260K",))
def test_shared_curves_equal_the_plain_path_bit_for_bit(kind, stories, corpus, monkeypatch):
    model, ids = _model_and_ids(kind, stories, corpus)
    shared, memo_s = _run(model, ids, monkeypatch, share=True)
    plain, memo_p = _run(model, ids, monkeypatch, share=False)
    assert _same_evaluations(memo_s, memo_p) >= 4  # the baseline and at least three sets
    assert shared.methods == plain.methods and shared.baseline == {**plain.baseline, "seconds": shared.baseline["seconds"]}
    st = shared.stats["prefix"]
    # every set that keeps block 0 ran from the recorded states on every batch; the plain run recorded nothing
    sets = [frozenset(k[1]) for k in memo_s.store if k[1]]
    assert st["recorded_batches"] == 3 and st["unrecorded_batches"] == 0
    assert st["shared_batches"] == 3 * sum(min(s) > 0 for s in sets) and st["full_batches"] == 3 * sum(min(s) == 0 for s in sets)
    assert sum(min(s) > 0 for s in sets) >= 3
    assert plain.stats["prefix"]["recorded_batches"] == 0 and plain.stats["prefix"]["shared_batches"] == 0
    # and against the plainest path: each set's pruned copy evaluated alone, base distribution re-run for the KL
    base = evaluate_ppl(model, ids, EV.window, EV.stride, capture_reference=True)
    for s in sets:
        ref = evaluate_ppl(pruned_copy(model, sorted(s)), ids, EV.window, EV.stride, reference=base.reference)
        got = memo_s.store[next(k for k in memo_s.store if frozenset(k[1]) == s)]
        assert np.array_equal(got.nll, ref.nll) and np.array_equal(got.kl, ref.kl), sorted(s)
    from swapkl.model import architectures as arch

    assert all("forward" not in vars(b) for b in arch.locate(model).blocks)  # the caller's blocks untouched


@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_shared_sublayer_curves_equal_the_plain_path(unit, monkeypatch):
    model, ids = _model_and_ids("llama")
    shared, memo_s = _run(model, ids, monkeypatch, share=True, unit=unit)
    plain, memo_p = _run(model, ids, monkeypatch, share=False, unit=unit)
    assert _same_evaluations(memo_s, memo_p) >= 4
    assert shared.methods == plain.methods
    assert shared.stats["prefix"]["shared_batches"] > 0


def test_a_baseline_read_from_the_memo_records_nothing_and_sets_run_in_full():
    model, ids = _model_and_ids("llama")
    memo = EvalMemo()
    first = C.removal_curves(model, None, scores5(), RemovalPlan(budget=1, methods=["replacement"], evaluator=EV),
                             RunHooks(memo=memo, eval_ids=ids))
    again = C.removal_curves(model, None, scores5(), RemovalPlan(budget=2, methods=["replacement"], evaluator=EV),
                             RunHooks(memo=memo, eval_ids=ids))
    assert first.stats["prefix"]["shared_batches"] == 3
    assert "prefix" not in again.stats  # the baseline came from the memo: the new set ran in full
    fresh = C.removal_curves(model, None, scores5(), RemovalPlan(budget=2, methods=["replacement"], evaluator=EV),
                             RunHooks(memo=EvalMemo(), eval_ids=ids))
    assert again.methods == fresh.methods


@pytest.mark.parametrize("kind", FAMILY_NAMES + ("stories260K",))
def test_sleb_trials_share_the_calibration_prefix_bit_for_bit(kind, stories, corpus, monkeypatch):
    """SLEB's trial sets on calibration text start from the base's states recorded there
    (``MethodContext.calib_result``): every evaluation, calibration trials included, equals the plain path's."""
    from swapkl.removal.methods import base as B

    model = stories.model if kind == "stories260K" else tiny_model(kind, num_layers=5, vocab=512)
    ids = eval_ids(corpus, stories.tokenizer, EV)
    stores, real = [], B.MethodContext._recording

    def recording(self, key):
        out = real(self, key)
        stores.append(self._prefix[key])
        return out
    monkeypatch.setattr(B.MethodContext, "_recording", recording)
    full, memos, results = prefix.CURVES_STATES_BYTES, {}, {}
    for share in (True, False):
        monkeypatch.setattr(prefix, "CURVES_STATES_BYTES", full if share else 0)
        memos[share] = EvalMemo()
        plan = RemovalPlan(budget=2, methods=("sleb",), evaluator=EV, method_params={"sleb": {"calib_tokens": 160}})
        results[share] = C.removal_curves(model, stories.tokenizer, scores5(), plan,
                                          RunHooks(memo=memos[share], eval_ids=ids, corpus=corpus))
        if share:
            (calib,) = stores  # one calibration text, recorded once for every trial
            trials = [k for k in memos[True].store if k[0].startswith("calib:") and k[1]]
            # 160 tokens: windows of 64, 64 and 32; batches of one window first, then of each shape
            assert calib.stats["recorded_batches"] == 3
            assert calib.stats["shared_batches"] == 3 * sum(min(k[1]) > 0 for k in trials) > 0
    assert _same_evaluations(memos[True], memos[False]) >= 8  # trials of two steps, the base, the curve's sets
    assert results[True].methods == results[False].methods
    assert results[True].method_info["sleb"]["steps"] == results[False].method_info["sleb"]["steps"]
