"""The KL implementations (swapkl/scoring/kl.py) equal today's kl_from_logits: bit for bit where the algorithm is the
same (chunked), to float32 rounding where it is fused (compiled); the choice is a recorded setting with a guarded
fallback."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FAMILY_NAMES, tiny_model
from swapkl.contract import Contract, pair_list
from swapkl.errors import ContractError
from swapkl.scoring import kl as klmod
from swapkl.scoring.engine import SwapEngine
from swapkl.scoring.kl import KLFunction, base_distribution, kl_chunked, kl_from_logits, kl_rows
from swapkl.scoring.score import score


def _inputs(rows=3, T=7, V=500, dtype=torch.float32, seed=0, kl_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    zb = torch.randn(rows, T, V, generator=g) * 3
    z = (zb + torch.randn(rows, T, V, generator=g)).to(dtype)
    p, logp = base_distribution(zb, kl_dtype)
    return p, logp, z


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kl_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("slice_rows", [1, 2, 5, 21, 1000])
def test_chunked_is_bit_for_bit_the_plain_kl(dtype, kl_dtype, slice_rows):
    p, logp, z = _inputs(dtype=dtype, kl_dtype=kl_dtype)
    item = torch.finfo(kl_dtype).bits // 8
    want = kl_from_logits(p, logp, z)
    got = kl_chunked(p, logp, z, slice_bytes=slice_rows * 500 * item)
    assert got.shape == (3, 7) and got.dtype == kl_dtype
    assert torch.equal(got, want)
    assert want.min() > 0.01  # real KLs, not zeros
    # and the plain KL is the textbook one to float32 rounding
    torch.testing.assert_close(want.double(), kl_rows(logp.double(), z.double()), rtol=1e-5, atol=1e-6)


def test_last_position_shape_is_sliced_too():
    p, logp, z = _inputs(rows=9, T=1, V=300)
    assert torch.equal(kl_chunked(p, logp, z, slice_bytes=2 * 300 * 4), kl_from_logits(p, logp, z))


@pytest.mark.parametrize("kind", FAMILY_NAMES)
def test_engine_with_chunked_kl_equals_engine_with_plain_kl_exactly(kind, monkeypatch):
    monkeypatch.setattr(klmod, "CPU_SLICE_BYTES", 3 * 96 * 4)  # three positions per slice: really sliced
    model = tiny_model(kind, num_layers=4)
    ids = torch.randint(0, 96, (3, 10), generator=torch.Generator().manual_seed(1))
    pairs = pair_list("all", 4)
    plain = SwapEngine(model, ids, kl_impl="plain")
    chunked = SwapEngine(model, ids, kl_impl="chunked")
    assert plain.head.kl.record == {"asked": "plain", "used": "plain", "fallback": None}
    assert chunked.head.kl.used == "chunked" and chunked.head.kl.slice_bytes == 3 * 96 * 4
    a, b = plain.sweep(pairs), chunked.sweep(pairs)
    for p in pairs:
        for k in ("repl_ij", "repl_ji", "inter"):
            assert torch.equal(a[p][k], b[p][k]), (p, k)
    assert min(v.min().item() for d in a.values() for v in d.values()) > 1e-3


def test_auto_is_chunked_on_a_cpu_and_compiled_on_cuda():
    assert KLFunction("auto", "cpu").record == {"asked": "auto", "used": "chunked", "fallback": None}
    assert KLFunction("auto", "cuda:0").used == "compiled"  # a device name only: nothing runs on it
    assert KLFunction("auto", "cuda").slice_bytes == klmod.GPU_SLICE_BYTES
    with pytest.raises(ValueError, match="one of auto, compiled, chunked, plain"):
        KLFunction("fused", "cpu")


def test_a_compiled_kl_that_fails_to_build_falls_back_and_says_why(monkeypatch):
    def no_compiler(*a):
        raise RuntimeError("InductorError: CppCompileError: C++ compile error\nlong log")

    monkeypatch.setattr(klmod, "kl_compiled", no_compiler)
    f = KLFunction("compiled", "cpu")
    p, logp, z = _inputs()
    assert torch.equal(f(p, logp, z), kl_from_logits(p, logp, z))
    assert f.record["used"] == "chunked" and f.record["asked"] == "compiled"
    assert f.record["fallback"] == "torch.compile failed: RuntimeError: InductorError: CppCompileError: C++ compile error"
    assert torch.equal(f(p, logp, z), kl_from_logits(p, logp, z))  # stays on the fallback


def test_a_compiled_kl_that_disagrees_is_not_used(monkeypatch):
    monkeypatch.setattr(klmod, "kl_compiled", lambda p, logp, z: kl_from_logits(p, logp, z) * 1.01)
    f = KLFunction("compiled", "cpu")
    p, logp, z = _inputs()
    assert torch.equal(f(p, logp, z), kl_from_logits(p, logp, z))
    assert f.used == "chunked" and "the compiled KL gave" in f.record["fallback"]


def test_an_out_of_memory_error_in_the_compiled_kl_is_not_a_fallback(monkeypatch):
    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(klmod, "kl_compiled", oom)
    f = KLFunction("compiled", "cpu")
    with pytest.raises(torch.OutOfMemoryError):  # the engine halves its KL chunk and calls again
        f(*_inputs())
    assert f.used == "compiled" and f.record["fallback"] is None


def test_compiled_kl_equals_plain_to_float32_rounding():
    """The real torch.compile (about a minute to build on a CPU; the GPU run in tests/gpu/gpu_check.py checks it on
    CUDA).  Where no compiler works, the fallback must say so and give the plain values."""
    f = KLFunction("compiled", "cpu")
    for dtype, rows in ((torch.float32, 3), (torch.float32, 2)):  # a second shape reuses the dynamic build
        p, logp, z = _inputs(rows=rows, dtype=dtype, V=700)
        want = kl_from_logits(p, logp, z)
        got = f(p, logp, z)
        if f.used == "compiled":
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:
            assert f.record["fallback"].startswith("torch.compile failed") and torch.equal(got, want)


def test_the_setting_is_recorded_and_read_from_the_environment(stories, cache_dir, monkeypatch):
    c = Contract(pairs="adjacent", prompts=2, tokens=8)
    res = score(stories, c, use_cache=False)
    assert res.meta["engine"]["kl"] == {"asked": "auto", "used": "chunked", "fallback": None}
    monkeypatch.setenv("SWAPKL_KL", "plain")
    plain = score(stories, c, use_cache=False)
    assert plain.meta["engine"]["kl"]["used"] == "plain"
    np.testing.assert_array_equal(plain.interchange(), res.interchange())  # the same bits
    explicit = score(stories, c, use_cache=False, engine_kw={"kl_impl": "chunked"})
    assert explicit.meta["engine"]["kl"]["asked"] == "chunked"
    monkeypatch.setenv("SWAPKL_KL", "fast")
    with pytest.raises(ContractError, match="SWAPKL_KL='fast' is not a KL implementation"):
        score(stories, c, use_cache=False)
