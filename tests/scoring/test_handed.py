"""States the blocks hand on to each other besides the hidden states (swapkl.model.handed): HY-V4's DSA top-k indices
(its "shared" layers 2 and 3 reuse the previous layer's), ZAYA's router state.  A moved block's state flows in the
order the blocks run, as a module moved in the model's own block list does: the engine (batched, rows split across
calls) equals the plain implementation (batch of one, modules moved or weights copied, float64 KL) under both
definitions; the plain implementation that ignored the order (each block given its own recorded state) gives other
numbers, so the check is sensitive; a block that needs a state no block before it hands on is n/a in slot 0 with its
reason; a removal passes the state on, in memory, exported and in the bridged sweep's unbridged removal."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import swapkl.scoring.reference as reference
from swapkl.contract import pair_list
from swapkl.model.handed import Channel
from swapkl.scoring.engine import SwapEngine
from swapkl.scoring.reference import reference_sweep
from swapkl.support.check import check_export, plain_removal, tiny_for_check

PAIRS = pair_list("all", 4)


@pytest.fixture(scope="module")
def tiny():
    cache: dict = {}

    def get(model_type: str):
        if model_type not in cache:
            cache[model_type] = tiny_for_check(model_type)
        return cache[model_type]
    return get


def _worst(got: dict, ref: dict) -> float:
    return max(((got[p][k].double() - v).abs() / v.abs()).max().item() for p in ref for k, v in ref[p].items())


def test_channels_are_found_on_the_baseline(tiny):
    for model_type, want in (("hy_v4", (Channel("prev_topk_indices", 1),)), ("zaya", (Channel(0, 1),)),
                             ("llama", ())):
        model, ids, _ = tiny(model_type)
        engine = SwapEngine(model, ids, max_rows=3, max_live=6)
        assert engine.runner.recording.channels == want, model_type
        if want:  # the state entering slot s is what block s-1 handed on in the baseline, one row per prompt
            assert engine.base.handed[0] == (None,)
            assert all(h[0].shape[0] == ids.shape[0] for h in engine.base.handed[1:])
        else:
            assert engine.base.handed == []


@pytest.mark.parametrize("model_type", ["hy_v4", "zaya"])
@pytest.mark.parametrize("per_layer", ["block", "slot"])
def test_engine_equals_the_plain_implementation(tiny, model_type, per_layer):
    model, ids, _ = tiny(model_type)
    engine = SwapEngine(model, ids, max_rows=3, max_live=6, per_layer=per_layer, kl_dtype=torch.float64)
    undefined = engine.undefined(PAIRS)
    got = engine.sweep([p for p in PAIRS if p not in undefined])
    ref = reference_sweep(model, ids, PAIRS, per_layer=per_layer)
    assert set(ref) == set(got) == set(PAIRS) - set(undefined)
    assert _worst(got, ref) < 1e-5  # float32 blocks; a wrong state is off by 1e-3 to 1e-1 (below)
    assert min(v.mean().item() for p in ref for v in ref[p].values()) > 1e-5


@pytest.mark.parametrize("model_type,pair,kind", [("hy_v4", (1, 2), "inter"), ("zaya", (0, 1), "repl_ij")])
def test_the_state_follows_the_order_the_blocks_run(tiny, monkeypatch, model_type, pair, kind):
    # each moved block given its own recorded state instead (what the engine did before it carried the state)
    model, ids, _ = tiny(model_type)
    got = SwapEngine(model, ids, max_rows=3, max_live=6, per_layer="block", kl_dtype=torch.float64).sweep([pair])
    monkeypatch.setattr(reference, "find_channels", lambda calls, outs: ())
    stale = reference_sweep(model, ids, [pair], per_layer="block")
    diff = ((got[pair][kind].double() - stale[pair][kind]).abs() / stale[pair][kind]).max().item()
    assert diff > 1e-3


def test_a_block_that_needs_a_handed_state_is_na_in_slot_0(tiny):
    model, ids, _ = tiny("hy_v4")  # blocks 2 and 3 reuse the previous layer's top-k; nothing runs before slot 0
    engine = SwapEngine(model, ids, max_rows=3, max_live=6, per_layer="block", kl_dtype=torch.float64)
    undefined = engine.undefined(PAIRS)
    assert set(undefined) == {(0, 2), (0, 3)}
    assert all("none runs before slot 0" in why and "Shared DSA layers" in why for why in undefined.values())
    with pytest.raises(ValueError, match=r"pair \(0, 2\) is undefined"):
        engine.sweep([(0, 2)])


@pytest.mark.parametrize("model_type", ["hy_v4", "zaya"])
def test_removal_passes_the_state_on(tiny, tmp_path, model_type):
    model, ids, dtype = tiny(model_type)
    assert check_export(model, ids, dtype, str(tmp_path))["status"] == "exact"


def test_bridged_sweep_unbridged_removal_equals_the_pruned_model(tiny):
    from swapkl.repair.bridge import Bridge
    from swapkl.repair.sweep import BridgedSweep

    model, ids, _ = tiny("hy_v4")
    D = model.config.hidden_size
    spans = [(1, 2), (1, 3), (2, 3)]  # block 2 (shared) after block 0: it reuses block 0's top-k
    got = BridgedSweep(model, ids, kl_dtype=torch.float64, max_rows=3).sweep(
        [Bridge(i, j, "residual", np.eye(D)) for i, j in spans])
    with torch.inference_mode():
        base = torch.log_softmax(model(input_ids=ids, use_cache=False).logits.double(), -1)
    for i, j in spans:
        lp = torch.log_softmax(plain_removal(model, ids, range(i, j)).double(), -1)
        want = (base.exp() * (base - lp)).sum(-1).mean(-1)
        assert torch.allclose(got[(i, j)]["raw"].double(), want, rtol=1e-5, atol=1e-9), (i, j)


@pytest.mark.parametrize("model_type", ["hy_v4", "reformer"])
def test_prefix_sharing_hands_the_state_on(tiny, model_type):
    # a removal set's pruned copy starting from the recorded state entering its first removed block also gets what the
    # block before it handed on (as its own tuple type: Reformer's forward reads the fields of a named tuple)
    from swapkl.measure.prefix import recording_every_block
    from swapkl.surgery.blocks import pruned_copy

    model, ids, _ = tiny(model_type)
    store, recording = recording_every_block(model, 4, 2 ** 26)
    with torch.inference_mode():
        recording(input_ids=ids, use_cache=False)
    for removed in ([2], [1, 2]):
        pm = pruned_copy(model, removed)
        assert store.attach(pm, removed)
        with torch.inference_mode():
            got = pm(input_ids=ids, use_cache=False).logits
        assert store.stats["shared_batches"] >= 1
        assert torch.allclose(got, plain_removal(model, ids, removed), rtol=1e-5, atol=1e-6), removed


def test_reformer_two_streams(tiny):
    # a reversible residual: each block takes (prev_attn_output, hidden_states) and returns (hidden_states,
    # attn_output, ...); the head reads both streams joined, the handed-on one first
    model, ids, _ = tiny("reformer")
    engine = SwapEngine(model, ids, max_rows=3, max_live=6, per_layer="block", kl_dtype=torch.float64)
    assert engine.runner.recording.channels == (Channel("prev_attn_output", 1),) and engine.runner.join == "handed-first"
    assert engine.base.handed[0][0] is not None  # slot 0 is handed the embeddings as its second stream
    got = engine.sweep(PAIRS)
    ref = reference_sweep(model, ids, PAIRS, per_layer="block")
    assert _worst(got, ref) < 1e-9


def test_score_reports_the_slot_0_pairs_na(tmp_path, monkeypatch):
    # score() learns these n/a pairs only from the baseline (a forward): they leave the sweep, not crash it
    from support.tiny_folder import tiny_checkpoint

    from swapkl.contract import Contract
    from swapkl.scoring.score import score

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    ck = tiny_checkpoint("hy_v4", tmp_path / "hy")
    steps: list = []
    got = score(ck, Contract(pairs="all", prompts=2, tokens=8, per_layer="block"),
                progress=lambda d, t, what: steps.append((d, t)))
    assert set(got.undefined) == {(0, 2), (0, 3)} and "none runs before slot 0" in got.undefined[(0, 2)]
    assert sorted(got.pairs) == [(0, 1), (1, 2), (1, 3), (2, 3)]
    assert steps[-1] == (12, 12)  # the progress total counts the pairs computed
