"""The memory model (swapkl/scoring/memory.py) against the measured peak on the CPU (the allocator's own events, as
max_memory_allocated counts them on a GPU): the estimate bounds the peak of a whole sweep, and one KL chunk holds
the bytes per element the model counts (18 for bf16 logits, not 12)."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from swapkl.contract import pair_list
from swapkl.scoring.engine import SwapEngine
from swapkl.scoring.kl import kl_bytes_per_element
from swapkl.scoring.memory import LIVE_COPIES, engine_limits, measured_peak, memory_estimate


def test_measured_peak_counts_what_is_alive_at_once():
    def work():
        a = torch.ones(1000, 1000)      # 4 MB
        b = torch.ones(2000, 1000)      # 8 MB
        del a
        c = torch.ones(500, 1000)       # 2 MB
        d = b * 2                       # 8 MB: b + c + d = 18 MB alive
        del d
        return b, c

    (b, c), peak = measured_peak(work)
    assert 18_000_000 <= peak <= 18_000_000 + 1024  # (and a few bytes of scalars)


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "gpt2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("avail_mib", [6, 24])
def test_the_estimate_bounds_the_measured_peak_of_a_sweep(kind, dtype, avail_mib):
    model = tiny_model(kind, num_layers=4, vocab=4096, hidden=64).to(dtype)
    P, T = 6, 32
    ids = torch.randint(0, 4096, (P, T), generator=torch.Generator().manual_seed(0))
    pairs = pair_list("all", 4)
    limits = engine_limits(model, P, T, avail=avail_mib * 2**20)
    # the budget binds: fewer KL rows than prompts (and, at 6 MiB in float32, fewer live sets than variants)
    assert limits["kl_chunk_rows"] < P
    assert limits["max_live"] < 3 * len(pairs) or avail_mib > 6 or dtype != torch.float32
    est = memory_estimate(model, P, T, limits, num_pairs=len(pairs))
    for impl in ("plain", "chunked"):
        res, peak = measured_peak(lambda impl=impl: SwapEngine(model, ids, kl_impl=impl, **limits).sweep(pairs))
        assert len(res) == len(pairs)
        assert 0 < peak <= est["total"], (impl, peak, est)
        assert est["total"] <= 5 * peak  # an upper bound, not a useless one
    assert est["total"] <= 1.1 * avail_mib * 2**20 + est["states"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_kl_chunk_holds_the_bytes_per_element_the_model_counts(dtype):
    model = tiny_model("llama", num_layers=2, vocab=32768, hidden=32).to(dtype)
    P, T, R = 4, 64, 2
    ids = torch.randint(0, 32768, (P, T), generator=torch.Generator().manual_seed(0))
    elements = R * T * 32768
    counted = kl_bytes_per_element(model.dtype.itemsize, 4)
    assert counted == (18 if dtype == torch.bfloat16 else 16)
    plain = SwapEngine(model, ids, kl_impl="plain", kl_chunk_rows=R, logp_budget=0)
    h = plain.base.states[-1]
    _, peak = measured_peak(lambda: plain.head.kl_many([h, h]))
    # the plain KL holds exactly what is counted (to the head's small [rows, T, D] tensors): not 12 bytes
    assert counted * elements <= peak <= counted * elements * 1.01
    chunked = SwapEngine(model, ids, kl_impl="chunked", kl_chunk_rows=R, logp_budget=0)
    _, peak_chunked = measured_peak(lambda: chunked.head.kl_many([h, h]))
    # the chunked KL holds p, log p and the logits, plus one cache-sized slice
    assert peak_chunked <= (8 + model.dtype.itemsize) * elements + 4 * 2 * 2**20
    assert peak_chunked < 0.8 * peak


def test_limits_count_four_live_copies():
    model = tiny_model("llama", num_layers=4, vocab=96, hidden=64)
    P, T = 8, 16
    avail = 64 * 2**20
    lim = engine_limits(model, P, T, avail=avail)
    states = 5 * P * T * 64 * 4
    per_set = P * T * 64 * 4
    assert LIVE_COPIES == 4
    assert lim["max_live"] == min(3 * 256, int((avail - states) * 0.5) // (4 * per_set))
