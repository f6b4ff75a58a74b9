"""The optimised engine equals the plain batch-of-one weight-copy implementation."""
from __future__ import annotations

import pytest
import torch

from conftest import FAMILY_NAMES, tiny_model
from swapkl.contract import pair_list
from swapkl.scoring.engine import noise_floor, SwapEngine
from swapkl.scoring.reference import reference_sweep

TOL = 1e-5


def _compare(model, ids, pairs_spec, positions, **kw):
    L = len(__import__("swapkl.model.architectures", fromlist=["locate"]).locate(model).blocks)
    pairs = pair_list(pairs_spec, L)
    eng = SwapEngine(model, ids, positions=positions, **kw)
    got = eng.sweep(pairs)
    ref = reference_sweep(model, ids, pairs, positions=positions)
    assert set(got) == set(pairs)
    worst = 0.0
    for p in pairs:
        for k in ("repl_ij", "repl_ji", "inter"):
            worst = max(worst, (got[p][k].double() - ref[p][k]).abs().max().item())
    # the KLs themselves are far above the tolerance, so a wrong variant cannot pass
    smallest = min(ref[p][k].mean().item() for p in pairs for k in ref[p])
    assert smallest > 100 * TOL
    assert worst < TOL, worst
    return eng, got, ref


@pytest.mark.parametrize("kind", FAMILY_NAMES)
@pytest.mark.parametrize("pairs_spec", ["adjacent", "gap:2", "all"])
@pytest.mark.parametrize("positions", ["all", "last"])
def test_engine_equals_reference_tiny(kind, pairs_spec, positions):
    model = tiny_model(kind, num_layers=5)
    ids = torch.randint(0, 96, (3, 10), generator=torch.Generator().manual_seed(1))
    # small max_live / max_rows force several chunks and split batches
    _compare(model, ids, pairs_spec, positions, max_live=4, max_rows=2)


@pytest.mark.parametrize("pairs_spec", ["adjacent", "gap:2", "all"])
@pytest.mark.parametrize("positions", ["all", "last"])
def test_engine_equals_reference_stories(stories_path, pairs_spec, positions):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(stories_path).eval()
    ids = torch.randint(3, 512, (3, 16), generator=torch.Generator().manual_seed(2))
    ids[:, 0] = 1
    _compare(model, ids, pairs_spec, positions)


def test_directions_are_distinct_and_interchange_is_not_replacement():
    model = tiny_model("llama", num_layers=4)
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(3))
    eng = SwapEngine(model, ids)
    got = eng.sweep([(0, 2)])[(0, 2)]
    assert not torch.allclose(got["repl_ij"], got["repl_ji"])
    assert not torch.allclose(got["repl_ij"], got["inter"])


def test_engine_runs_fewer_blocks_than_naive():
    model = tiny_model("gpt2", num_layers=6)
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(4))
    eng = SwapEngine(model, ids)
    eng.sweep(pair_list("all", 6))
    # docs/method.md §7: prefix reuse + shared branch run well under 60 % of the naive block evaluations
    assert eng.stats.block_calls < 0.6 * eng.stats.naive_block_calls


def test_noise_floor_is_tiny_in_float32():
    model = tiny_model("qwen3", num_layers=3)
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(5))
    assert abs(noise_floor(SwapEngine(model, ids))) < 1e-5


def test_fast_kl_equals_textbook_kl():
    from swapkl.scoring.engine import base_distribution, kl_from_logits, kl_rows

    g = torch.Generator().manual_seed(6)
    zb = torch.randn(3, 5, 300, generator=g) * 4
    z = zb + torch.randn(3, 5, 300, generator=g)
    p, logp = base_distribution(zb)
    fast = kl_from_logits(p, logp, z.clone())
    exact = kl_rows(torch.log_softmax(zb.double(), -1), z.double())
    torch.testing.assert_close(fast.double(), exact, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast, kl_rows(torch.log_softmax(zb, -1), z), rtol=1e-6, atol=1e-7)
    assert exact.min() > 1e-3


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_kl_dtype_float64_is_honoured(kind):
    """Contract ``kl_dtype="float64"``: on a float64 model the engine's KLs equal the float64 reference to
    ~1e-12, two orders better than float32 log-softmax can reach (so a float32 path cannot pass)."""
    model = tiny_model(kind, num_layers=4).double()
    ids = torch.randint(0, 96, (3, 10), generator=torch.Generator().manual_seed(7))
    pairs = pair_list("adjacent", 4)
    ref = reference_sweep(model, ids, pairs, kl_dtype=torch.float64)

    def worst(got):
        return max((got[p][k].double() - ref[p][k]).abs().max().item() for p in pairs for k in ref[p])

    got64 = SwapEngine(model, ids, kl_dtype=torch.float64).sweep(pairs)
    got32 = SwapEngine(model, ids, kl_dtype=torch.float32).sweep(pairs)
    assert all(v.dtype == torch.float64 for p in pairs for v in got64[p].values())
    assert worst(got64) < 1e-10
    assert worst(got32) > 100 * worst(got64)
    with pytest.raises(ValueError):
        SwapEngine(model, ids, kl_dtype=torch.float16)


def test_contract_kl_dtype_reaches_the_engine(stories, cache_dir, monkeypatch):
    """``score(ck, Contract(kl_dtype="float64"))`` builds its engine with float64 KL (the setting is in the
    cache key and is read); both contracts agree to float32 rounding."""
    from swapkl.scoring import score as api
    from swapkl.contract import Contract

    seen = []
    real = api.SwapEngine

    def spy(*a, **kw):
        seen.append(kw.get("kl_dtype"))
        return real(*a, **kw)

    monkeypatch.setattr(api, "SwapEngine", spy)
    c32 = Contract(pairs="adjacent", prompts=2, tokens=8)
    c64 = c32.with_(kl_dtype="float64")
    a = api.score(stories, c32)
    b = api.score(stories, c64)
    assert seen == [torch.float32, torch.float64]
    import numpy as np

    ra, rb = a.replacement(), b.replacement()
    assert np.array_equal(np.isnan(ra), np.isnan(rb)) and np.nanmin(ra) > 1e-2
    diff = np.nanmax(abs(ra - rb))
    assert 0 < diff < 1e-5  # different arithmetic (so float64 was used), same values to float32 rounding
