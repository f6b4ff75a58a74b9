"""``bridge-joint`` (SLEB's iteration on the bridged KL of whole sets): its KL against the plain deep-copy bridged
model in float64 on every family, its sets against a plain greedy over plainly computed joint KLs on stories260K,
the spacing rule between runs, and the one-pass fit of many spans."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.bridge_plain import near_identity, plain_bridged, plain_kl
from swapkl.removal.curves import removal_curves
from swapkl.measure.evaluate import Evaluator
from swapkl.measure.memo import EvalMemo
from swapkl.removal.methods.bridge_joint import admissible
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.repair.bridge import Bridge, bridged_model
from swapkl.repair.joint_kl import JointKL

EV = Evaluator("tiny", 200, 128, 64)
BRIDGE = {"calib_tokens": 1024, "calib_window": 64, "ridge": 0.0}


def plain_joint_kl(model, bridger, removed) -> float:
    """The plain joint bridged KL of ``removed``: a deep copy with each maximal run replaced by its least-squares
    folded bridge (``bridger``'s fit), mean over ``bridger``'s scoring prompts of the float64 KL, batch of one."""
    from swapkl.repair.bridge import spans_of

    ws = {sp: bridger.bridges(list(range(*sp)))[0].W for sp in spans_of(removed)}
    return float(plain_kl(model, plain_bridged(model, ws, "folded"), bridger.prompts.ids).mean())


@pytest.mark.parametrize("positions", ["all", "last"])
def test_joint_kl_equals_plain_every_family(family_model, positions):
    name, model = family_model
    d = model.get_input_embeddings().weight.shape[1]
    bridges = [Bridge(1, 2, "folded", near_identity(d, 1)), Bridge(3, 4, "folded", near_identity(d, 3))]
    ids = torch.randint(1, model.config.vocab_size, (5, 12), generator=torch.Generator().manual_seed(0))
    got = JointKL(model, ids, positions, torch.float64, rows=2)(bridged_model(model, bridges))
    plain_model = plain_bridged(model, {(b.start, b.end): b.W for b in bridges}, "folded")
    if positions == "all":
        want = plain_kl(model, plain_model, ids)
    else:
        with torch.inference_mode():
            want = torch.stack([
                torch.nn.functional.kl_div(torch.log_softmax(plain_model(input_ids=r[None], use_cache=False).logits[0, -1].double(), -1),
                                           torch.log_softmax(model(input_ids=r[None], use_cache=False).logits[0, -1].double(), -1),
                                           log_target=True, reduction="sum") for r in ids])
    assert got.shape == (5,) and got.dtype == torch.float64
    assert torch.allclose(got, want.double(), rtol=1e-4, atol=1e-7), (name, got, want)
    assert want.min() > 1e-4  # the bridges changed the model
    assert JointKL(model, ids, positions, torch.float64)(model).abs().max() < 1e-10  # the base against itself


def test_admissible_spacing_applies_between_runs_only():
    assert admissible([3, 4, 5], 3)  # one run: nothing asked inside it
    assert admissible([2, 3, 6], 2) and not admissible([2, 3, 5], 2)  # runs [2, 4) and [5, 6): 5 - 3 = 2, not > 2
    assert admissible([2, 4], 1) and not admissible([2, 4], 2)
    assert admissible([], 5) and admissible([7], 5)


def test_sets_are_a_plain_greedy_over_plain_joint_kls(stories, corpus):
    from swapkl.repair.bridger import Bridger

    plan = RemovalPlan(3, ["bridge-joint"], evaluator=EV, repair="bridge", bridge=BRIDGE, spacing=0)
    r = removal_curves(stories.model, stories.tokenizer, None, plan, RunHooks(corpus=corpus, memo=EvalMemo()))
    b = Bridger(stories.model, stories.tokenizer, corpus, BRIDGE)

    picks, trials = [], []
    for _ in range(3):
        cost = {c: plain_joint_kl(stories.model, b, picks + [c]) for c in (1, 2, 3) if c not in picks}  # default candidates of 5 blocks
        trials.append(cost)
        picks.append(min(cost, key=lambda c: (cost[c], c)))
    want = [sorted(picks[:n]) for n in range(1, 4)]
    assert [e["removed"] for e in r.methods["bridge-joint"]] == want
    assert [e["removed"] for e in r.repaired["bridge-joint"]] == want
    steps = r.method_info["bridge-joint"]["steps"]
    for step, cost in zip(steps, trials):
        for c, v in cost.items():
            assert step["trials"][str(c)] == pytest.approx(v, rel=2e-3, abs=1e-5)
    assert r.method_info["bridge-joint"]["layer_scores"][1] == pytest.approx(trials[0][1], rel=2e-3, abs=1e-5)
    assert not any("-token prompts" in x for x in r.notes)  # prompts (64 tokens) as long as the windows (64)


def test_one_pass_fits_equal_span_by_span(stories, corpus):
    from swapkl.repair.bridger import Bridger

    together = Bridger(stories.model, stories.tokenizer, corpus, BRIDGE)
    together.fit_spans([(1, 2), (1, 3), (2, 4), (3, 4)])
    alone = Bridger(stories.model, stories.tokenizer, corpus, BRIDGE)
    for sp in [(1, 2), (1, 3), (2, 4), (3, 4)]:
        w = alone.bridges(list(range(*sp)))[0].W
        assert np.allclose(together.fits[sp].W, w, rtol=1e-6, atol=1e-8)
    assert sorted(together.fits) == [(1, 2), (1, 3), (2, 4), (3, 4)]


def test_without_a_repair_it_fits_its_own_bridges_and_its_sets_are_evaluated_raw(stories, corpus):
    from swapkl.repair.bridger import Bridger

    plan = RemovalPlan(2, ["bridge-joint"], evaluator=EV, method_params={"bridge-joint": {"calib_tokens": 1024}})
    r = removal_curves(stories.model, stories.tokenizer, None, plan, RunHooks(corpus=corpus, memo=EvalMemo()))
    assert r.repaired == {} and "bridge-joint: its sets are evaluated without a bridge here" in r.notes[-1]
    # its own bridges' windows (256 tokens, the default) are longer than the default contract's prompts (64)
    assert any(n.startswith("bridge-joint: bridged KL scored on 64-token prompts, its bridges fitted on 256-token "
                            "windows") for n in r.notes), r.notes
    own = Bridger(stories.model, stories.tokenizer, corpus, {"calib_tokens": 1024})  # the method's own settings
    assert r.method_info["bridge-joint"]["settings"]["bridge"] == own.settings.to_dict()
    first = {c: plain_joint_kl(stories.model, own, [c]) for c in (1, 2, 3)}
    best = min(first, key=lambda c: (first[c], c))
    assert r.methods["bridge-joint"][0]["removed"] == [best]
    second = {c: plain_joint_kl(stories.model, own, [best, c]) for c in (1, 2, 3) if c != best}
    assert r.methods["bridge-joint"][1]["removed"] == sorted([best, min(second, key=lambda c: (second[c], c))])


def test_without_a_repair_it_scores_on_the_runs_prompts(stories, corpus):
    """Its own bridges score on the run's scoring contract (``hooks.contract``), not the default one: the first
    step's trial KLs equal plain joint KLs on that contract's prompts, with bridges fitted on calibration text that
    avoids them; the note names the contract's prompt length."""
    from swapkl.contract import Contract
    from swapkl.repair.bridger import Bridger

    contract = Contract(prompts=3, tokens=40, seed=5)
    plan = RemovalPlan(1, ["bridge-joint"], evaluator=EV, method_params={"bridge-joint": {"calib_tokens": 1024}})
    r = removal_curves(stories.model, stories.tokenizer, None, plan,
                       RunHooks(corpus=corpus, memo=EvalMemo(), contract=contract))
    own = Bridger(stories.model, stories.tokenizer, corpus, {"calib_tokens": 1024}, contract)
    assert own.prompts.ids.shape[0] == 3
    trials = r.method_info["bridge-joint"]["steps"][0]["trials"]
    for c in (1, 2, 3):
        assert trials[str(c)] == pytest.approx(plain_joint_kl(stories.model, own, [c]), rel=2e-3, abs=1e-5)
    assert any(n.startswith("bridge-joint: bridged KL scored on 40-token prompts") for n in r.notes), r.notes
