"""Ground truth per layer (swapkl.evidence.ground_truth): the prefix-reuse sweep equals a plain evaluator on a pruned
copy, the CIs resample windows paired with the baseline, and the memo serves a second call."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.measure import evaluate as E
from swapkl.evidence.ground_truth import ground_truth, single_removal_sweep
from swapkl.measure.memo import EvalMemo
from swapkl.surgery.prune import pruned_copy
from swapkl.model.tiny import scale_matrices


def _plain(model, ids, window, stride, L):
    base = E.evaluate_ppl(model, ids, window, stride, capture_reference=True)
    return base, {k: E.evaluate_ppl(pruned_copy(model, [k]), ids, window, stride, reference=base.reference)
                  for k in range(L)}


def _assert_same(sw, base, plain):
    np.testing.assert_allclose(sw.baseline.nll, base.nll, rtol=1e-5, atol=1e-4)
    for k, r in plain.items():
        np.testing.assert_array_equal(sw.removed[k].counts, r.counts)
        np.testing.assert_allclose(sw.removed[k].nll, r.nll, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(sw.removed[k].kl, r.kl, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt_neox", "gpt2"])
def test_sweep_equals_plain_evaluator_on_tiny_models(kind):
    model = tiny_model(kind, num_layers=4)
    ids = torch.randint(0, 96, (230,), generator=torch.Generator().manual_seed(1))
    base, plain = _plain(model, ids, 64, 32, 4)
    sw = single_removal_sweep(model, ids, 64, 32)
    _assert_same(sw, base, plain)
    # the layers really differ (the replayed state is not the embedding output)
    assert len({round(float(r.nll.sum()), 3) for r in plain.values()}) == 4


def test_sweep_gpt2_slot_scaling_follows_the_plain_copy():
    """GPT-2 with scale_attn_by_inverse_layer_idx: the kept blocks get the scaling of pruned_copy(model, [l])."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=96, n_positions=256,
                        scale_attn_by_inverse_layer_idx=True)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    scale_matrices(model)
    ids = torch.randint(0, 96, (150,), generator=torch.Generator().manual_seed(2))
    base, plain = _plain(model, ids, 48, 24, 4)
    _assert_same(single_removal_sweep(model, ids, 48, 24), base, plain)


def test_sweep_equals_plain_on_stories(stories_path):
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(stories_path).eval()
    tok = tf.AutoTokenizer.from_pretrained(stories_path)
    ids = torch.as_tensor(tok("Once upon a time there was a little girl who loved the sea. " * 40)["input_ids"])
    ids = ids[:700]
    base, plain = _plain(model, ids, 256, 128, 5)
    sw = single_removal_sweep(model, ids, 256, 128, batch_size=2)
    _assert_same(sw, base, plain)
    # and the caller's model is untouched: no hook left, a plain evaluation gives the same numbers again
    again = E.evaluate_ppl(model, ids, 256, 128)
    np.testing.assert_array_equal(again.nll, base.nll)


def test_ground_truth_cis_and_memo(tmp_path):
    model = tiny_model("llama", num_layers=4)
    ids = torch.randint(0, 96, (300,), generator=torch.Generator().manual_seed(3))
    ev = E.Evaluator("t", 100, 64, 32)
    memo = EvalMemo(disk=tmp_path / "ppl")
    gt = ground_truth(model, ids, ev, memo, "k")
    assert gt.computed == 4 and gt.layers == [0, 1, 2, 3]
    base, plain = _plain(model, ids, 64, 32, 4)
    for i, k in enumerate(gt.layers):
        assert gt.delta_ppl_pct[i] == pytest.approx(E.delta_pct(plain[k], base), rel=1e-4, abs=1e-4)
        assert gt.kl[i] == pytest.approx(plain[k].kl_to_base, rel=1e-4, abs=1e-6)
        lo, hi = E.delta_pct_ci(plain[k], base)
        assert gt.delta_ppl_pct_ci[i] == pytest.approx([lo, hi], rel=1e-3, abs=1e-3)
        assert gt.kl_ci[i][0] <= gt.kl[i] <= gt.kl_ci[i][1]
    # a fresh memo on the same folder: everything read back, nothing computed, same numbers
    gt2 = ground_truth(model, ids, ev, EvalMemo(disk=tmp_path / "ppl"), "k")
    assert gt2.computed == 0 and gt2.delta_ppl_pct == pytest.approx(gt.delta_ppl_pct)
