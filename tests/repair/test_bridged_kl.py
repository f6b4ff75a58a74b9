"""The third matrix (bridged swap-KL and the same span removed without a bridge) against the plain implementation:
a deep copy with the span's blocks deleted and the bridge inserted as a module, batch of one, float64 KL."""
import numpy as np
import pytest
import torch

from support.bridge_plain import plain_bridged, plain_kl
from swapkl.contract import Contract
from swapkl.repair.bridge import Bridge
from swapkl.repair.bridged_kl import BridgeSettings, BridgedResult, bridge_spans, bridged_scores
from swapkl.repair.calibration import CalibrationText, fit_bridges
from swapkl.repair.sweep import BridgedSweep
from swapkl.surgery.blocks import pruned_copy


def _check_against_plain(model, ids, bridges: list[Bridge], got: dict, tol=2e-5):
    for br in bridges:
        span = (br.start, br.end)
        want = plain_kl(model, plain_bridged(model, {span: br.W}, br.form), ids)
        raw = plain_kl(model, pruned_copy(model, range(*span)), ids)
        np.testing.assert_allclose(np.asarray(got[span]["bridged"], dtype=float), want.numpy(), rtol=1e-3, atol=tol)
        np.testing.assert_allclose(np.asarray(got[span]["raw"], dtype=float), raw.numpy(), rtol=1e-3, atol=tol)


@pytest.mark.parametrize("form", ["residual", "folded"])
def test_sweep_equals_plain_every_family(family_model, form):
    name, model = family_model
    gen = torch.Generator().manual_seed(1)
    calib = CalibrationText(torch.randint(1, 96, (8, 16), generator=gen), [], {"tokens": 128})
    ids = torch.randint(1, 96, (3, 10), generator=gen)
    spans = [(1, 2), (1, 3), (2, 4), (3, 4)] + ([(0, 2)] if form == "residual" else [])
    fits = fit_bridges(model, calib, spans, form, ridge=1e-3)
    bridges = [fits[s] for s in spans]
    sweep = BridgedSweep(model, ids, kl_dtype=torch.float64, max_live=4,
                         folded={i - 1 for i, _ in spans} if form == "folded" else set())
    got = sweep.sweep(bridges)
    _check_against_plain(model, ids, bridges, {s: {k: v.tolist() for k, v in d.items()} for s, d in got.items()})
    # on the calibration rows a fitted bridge is closer to the stream after the span than no bridge
    assert all(0 <= br.fit["residual"] < 1 for br in bridges)


@pytest.mark.parametrize("form", ["folded", "residual"])
def test_bridged_scores_on_stories(stories, cache_dir, form):
    contract = Contract(pairs="adjacent", prompts=4, tokens=32, kl_dtype="float64")
    settings = BridgeSettings(form=form, calib_tokens=512, calib_window=64)
    calls = []
    res = bridged_scores(stories, contract, settings, progress=lambda d, t, w: calls.append((d, t)))
    L = stories.num_layers
    assert sorted(res.spans) == sorted(bridge_spans(contract, L))
    assert calls[-1][0] == calls[-1][1] == len(res.spans)
    assert res.meta["computed_spans"] == len(res.spans)
    # the fits are recorded; spans from block 0 fall back to the residual form (folded) with the reason
    for (i, _j), v in res.spans.items():
        assert v["fit"]["tokens"] == 512 and v["fit"]["eps"] > 0
        assert v["fit"]["form"] == ("residual" if form == "residual" or i == 0 else "folded")
        if form == "folded" and i == 0:
            assert "starts at block 0" in v["fit"]["form_note"]
    # on this trained model the bridge repairs every span (measured: ~30-85 % less KL than no bridge)
    assert all(res.mean(s) < res.mean(s, "raw") for s in res.spans)
    # against the plain model: refit the same bridges and rebuild each variant by deep copy
    from swapkl.repair.calibration import calibration_text
    from swapkl.scoring.score import contract_prompts

    corpus, prompts, _ = contract_prompts(stories, contract)
    calib = calibration_text(stories.tokenizer, corpus, prompts.description, 32, 512, 64, 0)
    some = [(1, 2), (2, 3), (L - 2, L), (0, 1)]
    bridges = []
    for s in some:
        f = res.spans[s]["fit"]["form"]
        bridges.append(fit_bridges(stories.model, calib, [s], f, settings.ridge)[s])
    _check_against_plain(stories.model, prompts.ids, bridges, res.spans)
    # the matrix, CIs and a round trip
    m = res.matrix("bridged")
    assert m.shape == (L, L + 1) and np.isfinite(m[1, 2]) and np.isnan(m[2, 1])
    lo, hi = res.ci((1, 2))
    assert lo <= res.mean((1, 2)) <= hi
    back = BridgedResult.from_dict(res.to_dict())
    assert back.spans.keys() == res.spans.keys() and back.settings == res.settings
    # resumed from the cache: nothing computed again, the same numbers
    again = bridged_scores(stories, contract, settings)
    assert again.meta["computed_spans"] == 0 and again.spans[(1, 2)]["bridged"] == res.spans[(1, 2)]["bridged"]


def test_shards_split_the_spans(stories, cache_dir):
    contract = Contract(pairs="adjacent", prompts=2, tokens=16)
    settings = BridgeSettings(form="residual", calib_tokens=128, calib_window=32)
    a = bridged_scores(stories, contract, settings, shard=(0, 2), use_cache=False)
    b = bridged_scores(stories, contract, settings, shard=(1, 2), use_cache=False)
    assert not set(a.spans) & set(b.spans)
    assert set(a.spans) | set(b.spans) == set(bridge_spans(contract, stories.num_layers))


def test_bridge_cli(cli, stories_path, tmp_path):
    out = tmp_path / "b.json"
    rc, so, se = cli("bridge", stories_path, "--prompts", "2", "--tokens", "16", "--calib-tokens", "256",
                     "--calib-window", "32", "--form", "residual", "--device", "cpu", "--json", out)
    assert rc == 0, se
    res = BridgedResult.from_dict(__import__("json").loads(out.read_text()))
    assert "bridge form=residual calib=256 tokens" in so
    assert f"{res.mean((1, 2)):.4f} [" in so and len(res.spans) == len(bridge_spans(Contract(), 5))
    rc, so, se = cli("bridge", stories_path, "--unit", "mlp", "--device", "cpu")
    assert rc != 0 and "whole blocks only" in se
