"""Scaling on the CPU: chunked KL, out-of-memory retries (fault injection), bf16, device_map, memory sizing.

All KLs are in nats; per-prompt vectors have shape [P]."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.scoring.score import engine_limits, score
from swapkl.model.checkpoints import load_checkpoint
from swapkl.contract import Contract, pair_list
from swapkl.scoring.engine import SwapEngine
from swapkl.scoring.slots import BatchController, DeviceOutOfMemory
from swapkl.errors import ModelLoadError, SwapklError
from swapkl.scoring.reference import reference_sweep


def _ids(P=4, T=12, V=96, seed=1):
    return torch.randint(0, V, (P, T), generator=torch.Generator().manual_seed(seed))


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((torch.as_tensor(a[p][k]).double() - torch.as_tensor(b[p][k]).double()).abs().max().item()
               for p in a for k in ("repl_ij", "repl_ji", "inter"))


def oom(rows=None):
    return torch.OutOfMemoryError(f"CUDA out of memory (simulated at {rows} rows)")


# ----------------------------------------------------------------------------- chunked KL
@pytest.mark.parametrize("positions", ["all", "last"])
def test_chunked_kl_equals_unchunked_and_uncached(positions):
    model = tiny_model("llama", num_layers=4)
    ids = _ids(P=5)
    pairs = pair_list("all", 4)
    whole = SwapEngine(model, ids, positions=positions, kl_chunk_rows=5).sweep(pairs)
    one = SwapEngine(model, ids, positions=positions, kl_chunk_rows=1)
    assert one.head.batch.max_rows == 1 and one.head.cache is not None
    by_one = one.sweep(pairs)
    uncached = SwapEngine(model, ids, positions=positions, kl_chunk_rows=2, logp_budget=0)
    assert uncached.head.cache is None  # baseline log-probs recomputed per KL chunk
    no_cache = uncached.sweep(pairs)
    assert _max_diff(whole, by_one) < 1e-6
    assert _max_diff(whole, no_cache) < 1e-6
    # the vectors are real KLs, far above the tolerance, one value per prompt
    assert all(v.shape == (5,) for p in whole.values() for v in p.values())
    assert min(v.min().item() for p in whole.values() for v in p.values()) > 1e-3


def test_kl_many_shares_one_baseline_chunk():
    model = tiny_model("gpt2", num_layers=3)
    ids = _ids(P=3)
    eng = SwapEngine(model, ids, kl_chunk_rows=2, logp_budget=0)
    h = eng.base.states[-1]
    # the baseline against itself is exactly zero; a perturbed copy is positive (noise, not a shift:
    # the final LayerNorm removes a constant shift)
    got = eng.head.kl_many([h, h + torch.randn(h.shape, generator=torch.Generator().manual_seed(0))])
    assert torch.equal(got[0], torch.zeros(3)) and (got[1] > 1e-4).all()


# ----------------------------------------------------------------------------- out of memory
def test_batch_controller_halves_and_keeps_finished_ranges():
    calls = []

    def fault(rows, where):
        if rows > 3:
            raise oom(rows)

    bc = BatchController(16, fault=fault, where="block")
    out = bc.run(lambda x: (calls.append(x.shape[0]), x * 2)[1], torch.arange(10.0))
    assert torch.equal(out, torch.arange(10.0) * 2)
    assert [r["to"] for r in bc.retries] == [5, 2] and bc.max_rows == 2
    assert sum(calls) == 10  # nothing computed twice: failures happen before the call
    bc2 = BatchController(4, fault=lambda rows: (_ for _ in ()).throw(RuntimeError("unrelated")))
    with pytest.raises(RuntimeError, match="unrelated"):  # only out-of-memory errors are retried
        bc2.run(lambda x: x, torch.ones(3))


def test_simulated_oom_mid_sweep_halves_retries_reports_and_matches(stories, cache_dir):
    c = Contract(pairs="all", prompts=4, tokens=16, dtype="float32")
    clean = score(stories, c, use_cache=False, engine_kw={"max_rows": 16, "max_live": 6})
    state = {"calls": 0, "kl": 0}

    def fault(rows, where):
        # a memory cap: block calls above 3 rows fail from the 5th call on (mid-sweep), and the first
        # KL chunk of more than one prompt fails once
        if where == "block":
            state["calls"] += 1
            if state["calls"] >= 5 and rows > 3:
                raise oom(rows)
        if where == "kl" and rows > 1 and state["kl"] == 0 and state["calls"] > 0:
            state["kl"] += 1
            raise oom(rows)

    events = []
    with pytest.warns(UserWarning, match="out of memory in block: batch 16 -> 8, retrying"):
        res = score(stories, c, use_cache=False, progress=lambda d, t, what: events.append(what),
                    engine_kw={"max_rows": 16, "max_live": 6, "fault": fault, "kl_chunk_rows": 4})
    retries = res.meta["engine"]["oom_retries"]
    assert {"where": "block", "from": 16, "to": 8} in retries and {"where": "block", "from": 8, "to": 4} in retries
    assert any(r["where"] == "kl" for r in retries)
    assert res.meta["engine"]["max_rows"] == 2
    assert any("out of memory in block" in w for w in events)  # reported through progress too
    np.testing.assert_allclose(res.replacement_directed(), clean.replacement_directed(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(res.interchange(), clean.interchange(), atol=1e-6, rtol=0)
    assert np.nanmin(clean.interchange()) > 1e-3


def test_oom_in_baseline_is_retried(stories, cache_dir):
    c = Contract(pairs="adjacent", prompts=4, tokens=16)
    clean = score(stories, c, use_cache=False)

    def fault(rows, where):
        if where == "baseline" and rows > 1:
            raise oom(rows)

    with pytest.warns(UserWarning, match="out of memory in baseline"):
        res = score(stories, c, use_cache=False, engine_kw={"max_rows": 4, "fault": fault})
    assert [r["where"] for r in res.meta["engine"]["oom_retries"]][:2] == ["baseline", "baseline"]
    np.testing.assert_allclose(res.interchange(), clean.interchange(), atol=1e-6, rtol=0)


def test_oom_that_persists_at_one_row_halves_the_live_set_then_succeeds():
    model = tiny_model("qwen3", num_layers=4)
    ids = _ids(P=3)
    pairs = pair_list("all", 4)
    clean = SwapEngine(model, ids, max_rows=2, max_live=9).sweep(pairs)
    state = {"n": 0, "armed": False}

    def fault(rows, where):
        # after the baseline, the next 3 block calls fail whatever their size (too many live variants)
        if where == "block" and state["armed"] and state["n"] < 3:
            state["n"] += 1
            raise oom(rows)

    eng = SwapEngine(model, ids, max_rows=2, max_live=9, fault=fault)
    state["armed"] = True
    got = eng.sweep(pairs)
    kinds = [r["where"] for r in eng.stats.oom_retries]
    assert kinds == ["block", "live", "block"], eng.stats.oom_retries
    assert eng.stats.oom_retries[1] == {"where": "live", "from": 3, "to": 1}
    assert _max_diff(clean, got) < 1e-6


def test_oom_at_batch_one_is_a_clear_user_error(stories, cache_dir):
    def always(rows, where):
        raise oom(rows)

    with pytest.raises(DeviceOutOfMemory, match=r"out of memory even at batch 1 \(baseline.*bfloat16.*--tokens.*"
                                                r"device-map auto") as e:
        score(stories, Contract(prompts=2, tokens=8), use_cache=False, engine_kw={"fault": always})
    assert isinstance(e.value, SwapklError) and "\n" not in str(e.value)


def test_cli_prints_oom_as_one_line(stories_path, cache_dir, monkeypatch, capsys):
    from swapkl.scoring import engine
    from swapkl.commands.cli import main

    real = engine.SwapEngine.__init__

    def init(self, *a, **kw):
        kw["fault"] = lambda rows, where: (_ for _ in ()).throw(oom(rows))
        real(self, *a, **kw)

    monkeypatch.setattr(engine.SwapEngine, "__init__", init)
    rc = main(["score", str(stories_path), "--prompts", "2", "--tokens", "8", "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: out of memory even at batch 1") and "Traceback" not in err


# ----------------------------------------------------------------------------- bf16
@pytest.mark.parametrize("kind", ["llama", "gpt_neox"])
def test_bf16_engine_matches_bf16_reference_and_float32_loosely(kind):
    m32 = tiny_model(kind, num_layers=4)
    m16 = tiny_model(kind, num_layers=4).to(torch.bfloat16)
    ids = _ids(P=3, T=10)
    pairs = pair_list("gap:2", 4)
    got = SwapEngine(m16, ids, max_rows=2).sweep(pairs)
    assert all(v.dtype == torch.float32 for p in got.values() for v in p.values())  # KL in float32
    ref16 = reference_sweep(m16, ids, pairs)
    ref32 = reference_sweep(m32, ids, pairs)
    for p in pairs:
        for k in ("repl_ij", "repl_ji", "inter"):
            g, r16, r32 = got[p][k].double(), ref16[p][k], ref32[p][k]
            # same bf16 arithmetic as the plain implementation, up to batching order
            assert ((g - r16).abs() <= 1e-4 + 1e-3 * r16.abs()).all(), (p, k, g, r16)
            # bf16 rounding moves the KL by a few percent at most, never its order of magnitude
            assert ((g - r32).abs() <= 0.005 + 0.15 * r32.abs()).all(), (p, k, g, r32)
            assert r32.min() > 1e-3


def test_bf16_end_to_end_cli(stories_path, cache_dir, tmp_path):
    from swapkl.commands.cli import main

    out16, out32 = tmp_path / "bf16.json", tmp_path / "f32.json"
    common = [str(stories_path), "--pairs", "adjacent", "--prompts", "3", "--tokens", "16", "--device", "cpu",
              "--quiet"]
    assert main(["score", *common, "--dtype", "bfloat16", "--json", str(out16)]) == 0
    assert main(["score", *common, "--json", str(out32)]) == 0
    d16 = json.loads(out16.read_text())
    assert d16["contract"]["dtype"] == "bfloat16" and d16["meta"]["engine"]["dtype"] == "bfloat16"
    from swapkl.scoring.results import SwapResult

    r16, r32 = SwapResult.load(out16), SwapResult.load(out32)
    a, b = r16.interchange(), r32.interchange()
    mask = ~np.isnan(b)
    assert mask.sum() == 8 and np.isfinite(a[mask]).all()
    np.testing.assert_allclose(a[mask], b[mask], rtol=0.15, atol=0.01)
    # the bf16 noise floor (batched vs batch-of-one baseline) is recorded and small next to the signal
    assert r16.noise_floor is not None and abs(r16.noise_floor) < 0.01 * np.nanmin(b)


# ----------------------------------------------------------------------------- device_map
def test_explicit_device_map_with_hooks_gives_the_same_numbers(stories_path, cache_dir, stories):
    dm = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    dm |= {f"model.layers.{k}": "cpu" for k in range(5)}
    ck = load_checkpoint(str(stories_path), device="cpu", device_map=dm)
    hooked = [n for n, m in ck.model.named_modules() if hasattr(m, "_hf_hook")]
    assert "model.layers.0" in hooked and "lm_head" in hooked  # accelerate's device-aligning hooks
    assert ck.identity["fingerprint"] == stories.identity["fingerprint"]
    c = Contract(pairs="all", prompts=3, tokens=12)
    a = score(ck, c, use_cache=False)
    b = score(stories, c, use_cache=False)
    np.testing.assert_allclose(a.replacement_directed(), b.replacement_directed(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(a.interchange(), b.interchange(), atol=1e-6, rtol=0)
    assert np.isfinite(a.interchange()[0, 1]) and a.interchange()[0, 1] > 1e-3


def test_a_gpu_and_cpu_map_keeps_its_cpu_modules_resident(stories_path, monkeypatch):
    """A dict map over a GPU and the CPU: loaded on the CPU and dispatched with the CPU as main device (its CPU
    modules run there; accelerate would offload them to 'meta' otherwise).  The GPU run of tests/gpu/gpu_check.py
    checks the numbers; here, without a GPU, the decision and the calls."""
    import accelerate
    import transformers

    from swapkl.model.checkpoints import cpu_and_gpu_map

    dm = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": "cpu", "lm_head": "cpu"}
    dm |= {f"model.layers.{k}": (0 if k < 3 else "cpu") for k in range(5)}
    assert cpu_and_gpu_map(dm) and not cpu_and_gpu_map({"a": "cpu"}) and not cpu_and_gpu_map("auto")
    assert not cpu_and_gpu_map({"a": 0, "b": 1})
    seen = {}
    real = transformers.AutoModelForCausalLM.from_pretrained

    def from_pretrained(*a, **kw):
        seen["load_map"] = kw.get("device_map", "absent")
        return real(*a, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(accelerate, "dispatch_model", lambda model, **kw: seen.update(dispatch=kw))
    ck = load_checkpoint(str(stories_path), device="cpu", device_map=dm)
    assert seen["load_map"] is None  # nothing offloaded at load time
    assert seen["dispatch"]["main_device"] == "cpu" and seen["dispatch"]["device_map"] == dm
    assert seen["dispatch"]["force_hooks"] is True
    assert all(p.device.type == "cpu" for p in ck.model.parameters())  # (the fake dispatch moved nothing)


def test_offloaded_layers_are_refused_clearly():
    model = tiny_model("llama", num_layers=3)
    model.model.layers[1].to("meta")  # what cpu/disk offload leaves in the module
    with pytest.raises(ModelLoadError, match="layer 1 is offloaded"):
        SwapEngine(model, _ids(P=1, T=4))


def test_weights_on_another_device_are_copied_once():
    model = tiny_model("llama", num_layers=3)
    eng = SwapEngine(model, _ids(P=1, T=4))
    r = eng.runner
    assert r.unit_weights.on(1, torch.device("cpu")) is r.unit_weights.weights[1]  # same device: no copy
    w = r.unit_weights.on(1, torch.device("meta"))  # stands in for "another GPU"
    assert all(t.device.type == "meta" for t in w.values()) and r.unit_weights.on(1, torch.device("meta")) is w


# ----------------------------------------------------------------------------- memory sizing
def test_engine_limits_scale_with_the_problem(stories):
    small = engine_limits(stories, 4, 16)
    big = engine_limits(stories, 400, 512)
    for lim in (small, big):
        assert set(lim) == {"max_rows", "max_live", "kl_chunk_rows", "logp_budget"}
        assert lim["max_rows"] >= 1 and lim["max_live"] >= 3 and lim["kl_chunk_rows"] >= 1
    assert big["max_rows"] < small["max_rows"] and big["max_live"] < small["max_live"]
    assert engine_limits(stories.model, 4, 16) == small  # a bare model works too
    assert small["kl_chunk_rows"] <= 4


def test_precision_noise_floor_in_bf16(stories_path, cache_dir):
    """Below float32 the noise floor includes precision: KL between the bf16 baseline and the same weights
    computed in float32 (one block upcast at a time). In float32 that part is exactly 0."""
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.engine import precision_floor, SwapEngine

    ck16 = load_checkpoint(str(stories_path), device="cpu", dtype="bfloat16")
    res = score(ck16, Contract(pairs="adjacent", prompts=3, tokens=16, dtype="bfloat16"))
    parts = res.meta["noise_floor_parts"]
    assert parts["precision"] > 0 and res.noise_floor == max(parts.values())
    # a real, small effect: far below the swap-KLs, and the same as a float32 model on the bf16-rounded weights
    assert parts["precision"] < 0.05 * np.nanmin(res.interchange())
    m32 = load_checkpoint(str(stories_path), device="cpu", dtype="bfloat16").model.float()
    ids = torch.tensor(res.prompt_token_ids)
    lp32 = torch.log_softmax(m32(input_ids=ids[:2], use_cache=False).logits.float(), -1)
    lp16 = torch.log_softmax(ck16.model(input_ids=ids[:2], use_cache=False).logits.float(), -1)
    direct = (lp16.exp() * (lp16 - lp32)).sum(-1).mean().item()
    # same size as the KL to a float32 model on the bf16-rounded weights (not identical: the slot arguments,
    # e.g. rotary cos/sin, were captured in bf16)
    assert parts["precision"] == pytest.approx(direct, rel=0.3)
    assert precision_floor(SwapEngine(m32, ids[:2])) == 0.0
