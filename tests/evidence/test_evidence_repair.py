"""Evidence after repair: the bridged ground truth equals a plain implementation (deep copy, plain lstsq bridge,
evaluate_ppl), its cache returns the same numbers, and the agreement with it equals scipy + a plain bootstrap."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import WIKITEXT
from support.bridge_plain import plain_bridged
from swapkl.model import architectures as arch
from swapkl.removal.bridged_truth import bridged_ground_truth
from swapkl.removal.evaluate import Evaluator, delta_pct, eval_ids, evaluate_ppl
from swapkl.repair.bridged_kl import BridgeSettings
from swapkl.repair.calibration import calibration_text
from swapkl.scoring.corpora import load_corpus
from swapkl.scoring.prompts import make_prompts

EV = Evaluator("tiny", 300, 128, 64)


@pytest.fixture(scope="module")
def setup(stories):
    corpus = load_corpus(str(WIKITEXT))
    prompts = make_prompts(stories.tokenizer, corpus, 4, 32, seed=0)
    settings = BridgeSettings(calib_tokens=2048, calib_window=128, ridge=0.0)
    calib = calibration_text(stories.tokenizer, corpus, prompts.description, 32, settings.calib_tokens,
                             settings.calib_window, settings.calib_seed)
    ids = eval_ids(corpus, stories.tokenizer, EV)
    return corpus, settings, calib, ids


def _plain_activations(model, ids, slots, proj):
    """Block inputs of ``slots`` and block ``proj``'s MLP output projection output, plain hooks on a deep copy, one
    row at a time; rows of tokens (N, d) float64."""
    m = copy.deepcopy(model)
    loc = arch.locate(m)
    got = {}
    for s in slots:
        loc.blocks[s].register_forward_pre_hook(
            lambda mod, a, k, s=s: got.setdefault(s, []).append(a[0] if a else k["hidden_states"]), with_kwargs=True)
    if proj is not None:
        arch.get_path(loc.blocks[proj], loc.family.mlp_out).register_forward_hook(
            lambda mod, a, o: got.setdefault("m", []).append(o))
    with torch.inference_mode():
        for row in ids:
            m(input_ids=row[None], use_cache=False)
    return {k: torch.cat(v, 0).reshape(-1, v[0].shape[-1]).double().numpy() for k, v in got.items()}


def _plain_delta(model, ids, calib, ell):
    """ΔPPL % and mean KL of block ``ell`` removed with its plain bridge: residual at block 0, folded after."""
    form = "residual" if ell == 0 else "folded"
    act = _plain_activations(model, calib.ids, {ell, ell + 1}, ell - 1 if form == "folded" else None)
    x, y = (act[ell], act[ell + 1]) if form == "residual" else (act["m"], act[ell + 1] - act[ell] + act["m"])
    W = np.linalg.lstsq(x, y, rcond=None)[0]
    plain = plain_bridged(model, {(ell, ell + 1): W}, form)
    base = evaluate_ppl(model, ids, EV.window, EV.stride, capture_reference=True)
    r = evaluate_ppl(plain, ids, EV.window, EV.stride, reference=base.reference)
    return delta_pct(r, base), r.kl_to_base, form


def test_bridged_ground_truth_equals_plain(stories, setup, cache_dir):
    corpus, settings, calib, ids = setup
    layers = [0, 2]
    gt, rec = bridged_ground_truth(stories.model, ids, EV, calib, settings, "text-key", stories.identity,
                                   layers=layers)
    assert gt.computed == 2 and gt.layers == layers
    for k, ell in enumerate(layers):
        d, kl, form = _plain_delta(stories.model, ids, calib, ell)
        assert gt.delta_ppl_pct[k] == pytest.approx(d, rel=1e-3, abs=1e-3)
        assert gt.kl[k] == pytest.approx(kl, rel=1e-3, abs=1e-5)
        lo, hi = gt.delta_ppl_pct_ci[k]
        assert lo <= gt.delta_ppl_pct[k] <= hi
        assert rec["forms"][str(ell)]["form"] == form
    assert rec["forms"]["0"]["note"] and "block 0" in rec["forms"]["0"]["note"]
    assert rec["settings"]["calib_tokens"] == 2048 and rec["calibration"]["windows"] == 16
    # the raw cut of block 2 costs more than the bridged one (the bridge repairs something)
    raw = evaluate_ppl(arch_pruned(stories.model, [2]), ids, EV.window, EV.stride)
    base = evaluate_ppl(stories.model, ids, EV.window, EV.stride)
    assert delta_pct(raw, base) > gt.delta_ppl_pct[1]
    # a second call reads the store entry: same numbers, nothing computed
    again, _ = bridged_ground_truth(stories.model, ids, EV, calib, settings, "text-key", stories.identity,
                                    layers=layers)
    assert again.computed == 0 and again.delta_ppl_pct == gt.delta_ppl_pct and again.kl == gt.kl
    assert list((cache_dir / "evidence").glob("bridged-truth-*.json"))
    # other bridge settings are another entry
    other = BridgeSettings(calib_tokens=2048, calib_window=128, ridge=1e-2)
    third, rec3 = bridged_ground_truth(stories.model, ids, EV, calib, other, "text-key", stories.identity,
                                       layers=layers)
    assert third.computed == 2 and rec3["settings"]["ridge"] == 1e-2


def arch_pruned(model, remove):
    from swapkl.surgery.blocks import pruned_copy

    return pruned_copy(model, remove)
