"""The two methods of removal with repair: ``bridge`` (sets by the bridged KL of each block alone, under the guided
rule) against a plain greedy choice over plainly computed bridged single-block KLs, and ``replaceme`` (the contiguous
span closest in angle) against a plain argmin of the angular distance; both also run without a repair (raw)."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from support.bridge_plain import plain_activations, plain_bridged, plain_kl
from swapkl.removal.curves import removal_curves
from swapkl.measure.evaluate import Evaluator
from swapkl.measure.memo import EvalMemo
from swapkl.removal.plan import RemovalPlan, RunHooks

EV = Evaluator("tiny", 200, 128, 64)
BRIDGE = {"calib_tokens": 1024, "calib_window": 64, "ridge": 0.0}


def test_bridge_sets_are_a_plain_greedy_choice_over_plain_bridged_kls(stories, corpus):
    from swapkl.repair.bridger import Bridger

    plan = RemovalPlan(2, ["bridge"], evaluator=EV, repair="bridge", bridge=BRIDGE)
    r = removal_curves(stories.model, stories.tokenizer, None, plan, RunHooks(corpus=corpus, memo=EvalMemo()))
    b = Bridger(stories.model, stories.tokenizer, corpus, BRIDGE)
    calib, prompts = b.calib.ids, b.prompts.ids
    plain = {}
    for lay in (1, 2, 3):  # the default candidates of 5 blocks; every one folds into block lay-1's MLP
        h = plain_activations(stories.model, calib, (lay, lay + 1), proj=lay - 1)
        m = h["m"]
        y = h[lay + 1] - h[lay] + m
        W = np.linalg.lstsq(m, y, rcond=None)[0]
        plain[lay] = float(plain_kl(stories.model, plain_bridged(stories.model, {(lay, lay + 1): W}, "folded"),
                                    prompts).mean())
    got = r.method_info["bridge"]["layer_scores"]
    for lay, v in plain.items():
        assert got[lay] == pytest.approx(v, rel=2e-3, abs=1e-5)
    order = sorted(plain, key=lambda k: (plain[k], k))
    picks = []
    for k in order:
        if len(picks) < 2 and all(abs(k - p) > 1 for p in picks):
            picks.append(k)
    want = [sorted(picks[:n]) for n in range(1, len(picks) + 1)]
    assert [e["removed"] for e in r.methods["bridge"]] == want
    assert [e["removed"] for e in r.repaired["bridge"]] == want


def _plain_calib_rows(corpus, tokenizer, tokens, window):
    words = corpus.prompt_text().split()
    ids = torch.as_tensor(tokenizer(" ".join(words[:tokens]))["input_ids"]).reshape(-1)[:tokens]
    return torch.stack([ids[s:s + window] for s in range(0, ids.numel() - window + 1, window)])


def test_replaceme_span_is_the_plain_argmin_of_angular_distance(stories, corpus):
    plan = RemovalPlan(3, ["replaceme"], evaluator=EV, method_params={"replaceme": {"calib_tokens": 512}})
    r = removal_curves(stories.model, stories.tokenizer, None, plan, RunHooks(corpus=corpus, memo=EvalMemo()))
    L = stories.num_layers
    h = {k: torch.from_numpy(v) for k, v in plain_activations(
        stories.model, _plain_calib_rows(corpus, stories.tokenizer, 512, EV.window), range(L + 1)).items()}

    def dist(a, b):
        cos = torch.nn.functional.cosine_similarity(h[a], h[b], dim=-1).clamp(-1, 1)
        return float((torch.arccos(cos) / torch.pi).mean())
    for n in (1, 2, 3):
        d = [dist(s, s + n) for s in range(L - n + 1)]
        s = int(np.argmin(d))
        assert r.methods["replaceme"][n - 1]["removed"] == list(range(s, s + n))
    assert any("--repair bridge adds the bridged" in x for x in r.notes) and r.repaired == {}


def test_replaceme_bridged_with_repair_and_block_zero_falls_back_to_residual(stories, corpus):
    d = np.full((5, 5), np.nan)
    for i in range(4):
        d[i, i + 1] = d[i + 1, i] = 0.1 * (i + 1)
    plan = RemovalPlan(2, ["replacement", "replaceme"], evaluator=EV, repair="bridge", bridge=BRIDGE,
                       candidates=(0, 2), exclude_boundary=False)
    r = removal_curves(stories.model, stories.tokenizer, {"replacement": d}, plan,
                       RunHooks(corpus=corpus, memo=EvalMemo()))
    assert [e["removed"] for e in r.methods["replacement"]] == [[0], [0, 2]]
    assert [e["removed"] for e in r.repaired["replaceme"]] == [e["removed"] for e in r.methods["replaceme"]]
    fits = r.repair["fits"]
    assert fits["0-1"]["form"] == "residual" and "block 0" in fits["0-1"]["form_note"]
    assert all(f["form"] == "folded" and not f["form_note"] for k, f in fits.items() if k != "0-1")
    notes = [x for x in r.notes if x.startswith("bridge: no exact fold")]
    assert notes == ["bridge: no exact fold for span(s) 0..0 (it starts at block 0 or the family has no fold): the "
                     "residual form is used there"]
