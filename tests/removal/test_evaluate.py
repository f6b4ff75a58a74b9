"""Perplexity evaluator: windows, equality with a plain token-by-token NLL, KL, CIs, contracts, bad text."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.scoring import corpora
from swapkl.errors import SwapklError
from swapkl.measure.evaluate import (EVALUATORS, EvalTextError, Evaluator, delta_pct, delta_pct_ci, eval_ids,
                                     evaluate_ppl, get_evaluator, kl_to_base, make_windows)




@pytest.mark.parametrize("n,window,stride", [(100, 16, 8), (101, 16, 5), (16, 16, 8), (10, 16, 8), (57, 20, 20)])
def test_windows_score_every_token_once(n, window, stride):
    wins = make_windows(n, window, stride)
    scored = [t for w in wins for t in range(w.first_target, w.end)]
    assert all(w.end - w.begin <= window for w in wins)
    assert all(w.first_target > w.begin for w in wins)  # at least one token of context
    if stride < window:
        assert scored == list(range(1, n))  # every token after the first, exactly once, in order
    else:  # non-overlapping chunks cannot score a chunk's first token
        assert len(scored) == len(set(scored)) and set(scored) == set(range(1, n)) - set(range(0, n, window))
    # cost is linear: number of windows ~ n / stride, fed tokens <= n + window
    assert len(wins) <= math.ceil(max(n - window, 0) / stride) + 1


def test_drop_first_target_switch():
    wins = make_windows(100, 16, 8, drop_first_target=False)
    dwins = make_windows(100, 16, 8, drop_first_target=True)
    assert sum(w.n_scored for w in dwins) == sum(w.n_scored for w in wins) - (len(wins) - 1)
    assert dwins[0] == wins[0] and all(d.first_target == w.first_target + 1 for d, w in zip(dwins[1:], wins[1:]))


def _plain_nll(model, ids, window, stride, drop_first=False):
    """Token-by-token reference: each scored token t is predicted from ids[begin:t] of the window that adds it."""
    n = len(ids)
    total, count, prev_end, k = 0.0, 0, 0, 0
    with torch.no_grad():
        for begin in range(0, n, stride):
            end = min(begin + window, n)
            start = max(prev_end, begin + 1) + (1 if drop_first and k > 0 else 0)
            for t in range(start, end):
                logits = model(input_ids=ids[begin:t][None], use_cache=False).logits[0, -1].double()
                total -= float(torch.log_softmax(logits, -1)[ids[t]])
                count += 1
            prev_end, k = end, k + 1
            if end == n:
                break
    return total, count


@pytest.mark.parametrize("kind,drop_first", [("llama", False), ("qwen3", True), ("gpt2", True),
                                             ("gpt_neox", False)])
def test_equals_token_by_token(kind, drop_first):
    model = tiny_model(kind)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (45,), generator=g)
    res = evaluate_ppl(model, ids, window=16, stride=6, drop_first_target=drop_first, batch_size=2)
    total, count = _plain_nll(model, ids, 16, 6, drop_first)
    assert res.n_scored == count
    assert res.nll.sum() == pytest.approx(total, rel=1e-5)
    assert res.ppl == pytest.approx(math.exp(total / count), rel=1e-5)
    # batching does not change the numbers
    res1 = evaluate_ppl(model, ids, window=16, stride=6, drop_first_target=drop_first, batch_size=1)
    np.testing.assert_allclose(res1.nll, res.nll, rtol=1e-5)


def test_kl_reference_matches_full_logits():
    base = tiny_model("llama")
    other = tiny_model("llama", seed=3)
    ids = torch.randint(0, 96, (70,), generator=torch.Generator().manual_seed(2))
    b = evaluate_ppl(base, ids, 24, 12, capture_reference=True)
    assert b.reference.kind == "hidden"
    r = evaluate_ppl(other, ids, 24, 12, reference=b.reference)
    # plain KL from full logits, window by window
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for w in make_windows(70, 24, 12):
            x = ids[w.begin:w.end][None]
            lb = torch.log_softmax(base(x, use_cache=False).logits[0].double(), -1)
            lo = torch.log_softmax(other(x, use_cache=False).logits[0].double(), -1)
            sl = slice(w.first_target - 1 - w.begin, w.end - 1 - w.begin)
            tot += float((lb[sl].exp() * (lb[sl] - lo[sl])).sum())
            cnt += w.n_scored
    assert r.kl_to_base == pytest.approx(tot / cnt, rel=1e-4)
    assert r.ppl == pytest.approx(evaluate_ppl(other, ids, 24, 12).ppl, rel=1e-6)  # same forward pass
    assert evaluate_ppl(base, ids, 24, 12, reference=b.reference).kl_to_base == pytest.approx(0.0, abs=1e-6)
    assert kl_to_base(base, other, ids, 24, 12) == pytest.approx(r.kl_to_base, rel=1e-6)
    # the caller's model carries no hook after capturing
    assert not base.lm_head._forward_pre_hooks
    with pytest.raises(SwapklError, match="different tokens"):
        evaluate_ppl(other, ids[:60], 24, 12, reference=b.reference)


def test_bootstrap_ci():
    model = tiny_model("gpt2")
    ids = torch.randint(0, 96, (200,), generator=torch.Generator().manual_seed(0))
    r = evaluate_ppl(model, ids, 32, 16)
    lo, hi = r.ci()
    assert lo < r.ppl < hi and r.ci() == (lo, hi)  # fixed seed: reproducible
    # ΔPPL of a model against itself is 0 with a degenerate CI; against another model the CI brackets it
    assert delta_pct(r, r) == 0.0 and delta_pct_ci(r, r) == (0.0, 0.0)
    r2 = evaluate_ppl(tiny_model("gpt2", seed=5), ids, 32, 16)
    a, b = delta_pct_ci(r2, r)
    assert a <= delta_pct(r2, r) <= b


def test_stories_reference_numbers(stories_path, wikitext_path):
    """tests/fixtures/README.md: PPL ≈ 113 on the first 512 tokens; removing one layer ≈ [1122, 494, 208, 240, 244]."""
    import transformers as tf

    from swapkl.surgery.prune import pruned_copy

    tok = tf.AutoTokenizer.from_pretrained(stories_path)
    model = tf.AutoModelForCausalLM.from_pretrained(stories_path).eval()
    corpus = corpora.from_file(wikitext_path)
    ids = eval_ids(corpus, tok, "matched")
    assert ids[0].item() == tok.bos_token_id and (ids == tok.bos_token_id).sum() == 1  # one BOS (Llama default)
    first = ids[:512]
    base = evaluate_ppl(model, first, 512, 256)
    assert base.n_scored == 511
    assert base.ppl == pytest.approx(113, rel=0.03)
    expected = [1122, 494, 208, 240, 244]
    got = [evaluate_ppl(pruned_copy(model, [k]), first, 512, 256).ppl for k in range(5)]
    for g, e in zip(got, expected):
        assert g == pytest.approx(e, rel=0.10)


def test_contracts_and_bad_text(stories_path, tmp_path):
    import transformers as tf

    assert (EVALUATORS["matched"].max_words, EVALUATORS["matched"].window, EVALUATORS["matched"].stride) == \
        (5000, 512, 256)
    assert (EVALUATORS["standard"].max_words, EVALUATORS["standard"].window, EVALUATORS["standard"].stride) == \
        (20000, 1024, 512)
    assert get_evaluator("matched", drop_first_target=True).drop_first_target
    with pytest.raises(SwapklError, match="unknown evaluator"):
        get_evaluator("nope")
    tok = tf.AutoTokenizer.from_pretrained(stories_path)
    short = corpora.from_text("a few words only " * 10, "short")
    with pytest.raises(EvalTextError, match="needs 5000"):
        eval_ids(short, tok, "matched")
    with pytest.raises(EvalTextError, match="one full window of 512"):
        eval_ids(short, tok, Evaluator("tiny", 10, 512, 256))
    with pytest.raises(EvalTextError, match="at least 2"):
        evaluate_ppl(tiny_model("llama"), torch.tensor([3]), 16, 8)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(SwapklError, match="empty"):
        corpora.from_file(empty)


def test_training_mode_model_is_evaluated_in_eval_mode_without_touching_it():
    model = tiny_model("gpt2")  # GPT-2 has dropout 0.1 in training mode
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(0))
    want = evaluate_ppl(model, ids, 16, 8).ppl
    model.train()
    with torch.no_grad():
        assert not torch.equal(model(ids[None]).logits, model(ids[None]).logits)  # dropout is live
    assert evaluate_ppl(model, ids, 16, 8).ppl == pytest.approx(want, rel=1e-6)  # no dropout
    assert model.training and all(m.training for m in model.modules())
