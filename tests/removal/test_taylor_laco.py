"""Taylor importance (vs a hand-computed gradient), the LaCo-style merge (in memory, export, reload) and both
methods in the curves runner."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.surgery.merge import MergeError, groups_from_pairs, merge_plan, merged_copy
from swapkl.removal.methods.taylor import taylor_importance
from swapkl.surgery.prune import PruneError, pruned_copy, read_prune_record, save_pruned
from swapkl.removal.plan import RemovalPlan, RunHooks


def _hand_taylor(model, ids, window):
    """Independent reference: plain loop, .backward() on a deep copy, per-parameter |grad * theta| summed per
    block by the module path ``model.layers.<k>.``."""
    import copy

    m = copy.deepcopy(model).eval()
    for p in m.parameters():
        p.requires_grad_(True)
        p.grad = None
    chunks = [ids[s:s + window] for s in range(0, ids.numel() - window + 1, window)]
    total = sum(c.numel() - 1 for c in chunks)
    for c in chunks:  # one window at a time: an independent accumulation order
        logits = m(input_ids=c[None], use_cache=False).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, c[1:], reduction="sum") / total
        loss.backward()
    out = np.zeros(m.config.num_hidden_layers)
    for name, p in m.named_parameters():
        if name.startswith("model.layers."):
            k = int(name.split(".")[2])
            out[k] += float((p.grad * p.detach()).abs().sum())
    return out


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_taylor_equals_hand_computed_gradient(kind):
    model = tiny_model(kind, num_layers=4)
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (48,))
    before = {n: (p.requires_grad, p.grad, p.detach().clone()) for n, p in model.named_parameters()}
    got = taylor_importance(model, ids, window=16, batch_size=2)
    if kind == "gpt2":  # GPT-2 blocks live under transformer.h
        import copy
        m = copy.deepcopy(model).eval()
        chunks = [ids[s:s + 16] for s in range(0, 48, 16)]
        total = sum(c.numel() - 1 for c in chunks)
        for c in chunks:
            lg = m(input_ids=c[None], use_cache=False).logits[0, :-1]
            (torch.nn.functional.cross_entropy(lg, c[1:], reduction="sum") / total).backward()
        want = np.zeros(4)
        for name, p in m.named_parameters():
            if name.startswith("transformer.h."):
                want[int(name.split(".")[2])] += float((p.grad * p.detach()).abs().sum())
    else:
        want = _hand_taylor(model, ids, 16)
    assert got.shape == (4,) and (got > 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # nothing leaked into the shared model: no .grad, same requires_grad flags, same weights, eval mode kept
    for n, p in model.named_parameters():
        rg, g, w = before[n]
        assert p.requires_grad == rg and p.grad is None and g is None
        assert torch.equal(p.detach(), w)
    assert not model.training
    again = taylor_importance(model, ids, window=16, batch_size=2)
    np.testing.assert_array_equal(got, again)  # deterministic


def test_taylor_keeps_frozen_flags():
    model = tiny_model("llama")
    for p in model.parameters():
        p.requires_grad_(False)
    taylor_importance(model, torch.arange(40) % 96, window=20)
    assert not any(p.requires_grad for p in model.parameters())


def _x():
    torch.manual_seed(3)
    return torch.randint(0, 96, (2, 12))


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt_neox", "gpt2"])
@pytest.mark.parametrize("mode", ["average", "laco"])
def test_merged_copy_values_and_reload(kind, mode, tmp_path):
    import transformers as tf

    model = tiny_model(kind, num_layers=5)
    orig = {n: p.detach().clone() for n, p in model.named_parameters()}
    mm = merged_copy(model, [[1, 2, 3]], mode)
    blocks = __import__("swapkl.model.architectures", fromlist=["x"]).locate(model).blocks
    mblocks = __import__("swapkl.model.architectures", fromlist=["x"]).locate(mm).blocks
    assert len(mblocks) == 3
    for (name, p) in mblocks[1].named_parameters():
        a, b, c = (blocks[i].get_parameter(name).detach() for i in (1, 2, 3))
        want = (a + b + c) / 3 if mode == "average" else a + (b - a) + (c - a)
        torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-6)
    # untouched tensors are shared, not copied; the merged block's are new
    assert mblocks[0].get_parameter(next(n for n, _ in blocks[0].named_parameters())) is \
        blocks[0].get_parameter(next(n for n, _ in blocks[0].named_parameters()))
    assert mblocks[2].get_parameter(next(n for n, _ in blocks[4].named_parameters())) is \
        blocks[4].get_parameter(next(n for n, _ in blocks[4].named_parameters()))
    name0 = next(n for n, _ in blocks[1].named_parameters())
    assert mblocks[1].get_parameter(name0) is not blocks[1].get_parameter(name0)
    for n, p in model.named_parameters():  # the source model is unchanged
        assert torch.equal(p.detach(), orig[n])
    assert len(blocks) == 5
    out = save_pruned(model, None, tmp_path / "m", merge={"groups": [[1, 2, 3]], "mode": mode})
    rec = read_prune_record(out)
    assert rec["removed"] == [2, 3] and rec["merge"]["groups"] == [[1, 2, 3]] and rec["merge"]["mode"] == mode
    re = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    x = _x()
    with torch.no_grad():
        a = mm(input_ids=x, use_cache=False).logits
        b = re(input_ids=x, use_cache=False).logits
        plain = pruned_copy(model, [2, 3])(input_ids=x, use_cache=False).logits
    torch.testing.assert_close(b, a, rtol=0, atol=1e-6)  # in-memory copy == its reload
    assert float((a - plain).abs().max()) > 1e-4  # merging is not plain removal


def test_merge_stories_reload(stories, tmp_path):
    import transformers as tf

    model, tok = stories.model, stories.tokenizer
    x = tok("Once upon a time there was a little girl", return_tensors="pt")["input_ids"]
    for mode in ("average", "laco"):
        out = save_pruned(model, [3], tmp_path / mode, tokenizer=tok, merge={"groups": [[2, 3]], "mode": mode})
        re = tf.AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            torch.testing.assert_close(re(input_ids=x, use_cache=False).logits,
                                       merged_copy(model, [[2, 3]], mode)(input_ids=x, use_cache=False).logits,
                                       rtol=0, atol=1e-6)


def test_merge_plan_errors():
    assert groups_from_pairs([(3, 4), (4, 5), (8, 9)]) == [[3, 4, 5], [8, 9]]
    assert merge_plan([[4, 5], [1, 2]], 8)["removed"] == [2, 5]
    for bad, msg in (([[1]], "at least two"), ([[1, 3]], "consecutive"), ([[1, 2], [2, 3]], "overlap"),
                     ([[6, 7]], "out of range"), ({"groups": [[1, 2]], "mode": "x"}, "unknown merge mode")):
        with pytest.raises(MergeError, match=msg):
            merge_plan(bad, 7)
    with pytest.raises(PruneError, match="does not match"):
        save_pruned(tiny_model("llama"), [1], "/tmp/never-written", merge=[[1, 2]])


def test_taylor_and_laco_in_curves_runner(stories):
    from swapkl.scoring.corpora import load_corpus
    from swapkl.measure.evaluate import Evaluator, evaluate_ppl, eval_ids
    from swapkl.measure.memo import EvalMemo
    from swapkl.removal.curves import removal_curves

    model, tok = stories.model, stories.tokenizer
    corpus = load_corpus()
    L = 5
    rng = np.random.default_rng(0)
    d = rng.uniform(0.1, 1.0, (L, L))
    d = (d + d.T) / 2
    d[2, 3] = d[3, 2] = 0.01  # (2, 3) is the best adjacent pair, then (1, 2)
    d[1, 2] = d[2, 1] = 0.02
    ev = Evaluator("tiny", 300, 128, 64)
    res = removal_curves(model, tok, {"replacement": d, "interchange": d}, RemovalPlan(budget=2, methods=["taylor", "laco"], evaluator=ev, spacing=0),
                         RunHooks(corpus=corpus, memo=EvalMemo()))
    lc = res.methods["laco"]
    assert [e["removed"] for e in lc] == [[3], [2, 3]]
    assert lc[1]["merge"] == "average: 1+2+3"
    assert res.method_info["laco"]["groups"] == [[[2, 3]], [[1, 2, 3]]]
    ids = eval_ids(corpus, tok, ev)
    want = evaluate_ppl(merged_copy(model, [[2, 3]], "average"), ids, 128, 64).ppl
    assert lc[0]["ppl"] == pytest.approx(want, rel=1e-9)
    plain = evaluate_ppl(pruned_copy(model, [3]), ids, 128, 64).ppl
    assert abs(plain - want) > 1e-6
    tay = res.method_info["taylor"]["taylor"]
    order = sorted(range(L), key=lambda i: (tay[i], i))
    assert res.methods["taylor"][0]["removed"] == [order[0]]
    from swapkl.removal.curves import CurvesResult
    CurvesResult.from_json(res.to_json())  # the merge label passes the schema


def test_prune_cli_merge(stories_path, tmp_path, capsys, monkeypatch):
    import transformers as tf

    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "merged"
    assert main(["prune", str(stories_path), "--merge", "1-2", "--merge-mode", "laco", "--out", str(out),
                 "--device", "cpu", "--verify"]) == 0
    text = capsys.readouterr().out
    assert "merged 1-2 (laco), removed layers [2], 4 of 5 kept" in text and "verified" in text
    rec = json.loads((out / "swapkl_prune.json").read_text())
    assert rec["merge"]["groups"] == [[1, 2]] and rec["merge"]["mode"] == "laco" and rec["removed"] == [2]
    assert tf.AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 4
    for args, msg in ((["--merge", "2-1"], "lower to a higher"), (["--merge", "a-b"], "groups such as"),
                      ([], "give --remove"), (["--merge", "1-2", "--remove", "1"], "does not match")):
        assert main(["prune", str(stories_path), "--out", str(tmp_path / "y"), "--device", "cpu", *args]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()][-1]
        assert err.startswith("error: ") and msg in err, err
