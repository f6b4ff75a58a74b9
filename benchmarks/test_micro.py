"""Micro-benchmarks in pytest-benchmark's form (seconds each; see benchmarks/conftest.py for the commands): the
KL of one chunk, plain against the fused ('auto') implementation, and one SwapEngine sweep of a tiny random model.
The whole-program benchmarks (the default model, the served app, the suite) are modules run by
``python -m benchmarks run NAME`` / ``compare``."""
from __future__ import annotations

import pytest
import torch

from swapkl.scoring.kl import KLFunction, base_distribution, kl_from_logits


@pytest.fixture(scope="module")
def chunk():
    g = torch.Generator().manual_seed(0)
    zb = torch.randn(4, 16, 4096, generator=g) * 3
    z = zb + torch.randn(zb.shape, generator=g)
    p, logp = base_distribution(zb)
    return p, logp, z


@pytest.mark.parametrize("impl", ["plain", "auto"])
def test_kl_chunk(benchmark, chunk, impl):
    f = KLFunction(impl, torch.device("cpu"))
    got = benchmark(f, *chunk)
    assert torch.allclose(got.double(), kl_from_logits(*chunk).double(), atol=1e-4)


def test_engine_sweep_tiny(benchmark):
    from benchmarks.engine_sweep import main

    res = benchmark.pedantic(main, args=(["--tiny", "--prompts", "2", "--tokens", "8"],), rounds=3, iterations=1)
    assert res["kl"] and all(v >= 0 for v in res["kl"].values())
