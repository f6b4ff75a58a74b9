"""The two per-layer definitions (docs/method.md §1) and block arguments rebuilt for every batch: BLOOM at any batch
size, a dense+MoE stack (an MoE block in a dense slot: the module moved under ``block``, ``n/a`` with its reason
under ``slot``), a layer-index constant (DiffLlama: the definitions differ, each equals its plain code), the score()
front door recording the definition in the contract, the cache key and the result."""
from __future__ import annotations

import pytest
import torch

from swapkl.contract import Contract, pair_list
from swapkl.model.tiny import tiny_model
from swapkl.scoring.engine import SwapEngine
from swapkl.scoring.reference import reference_sweep


def _ids(V: int, P: int = 3, T: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, min(V, 200), (P, T), generator=torch.Generator().manual_seed(seed))


def _worst(got: dict, ref: dict) -> float:
    return max(((got[p][k].double() - v).abs() / v.abs()).max().item() for p in ref for k, v in ref[p].items())


def test_bloom_alibi_at_every_batch_size():
    # ALiBi is one [batch * heads, 1, T] tensor per call: replayed from a batch of one it broke every other batch
    model = tiny_model("bloom").double()
    ids = _ids(256, P=8)
    pairs = pair_list("all", 4)
    ref = reference_sweep(model, ids, pairs)
    runs = {rows: SwapEngine(model, ids, max_rows=rows, max_live=6, kl_dtype=torch.float64).sweep(pairs)
            for rows in (1, 3, 8)}
    for rows, got in runs.items():
        assert _worst(got, ref) < 1e-9, rows
    assert min(v.mean().item() for p in ref for v in ref[p].values()) > 1e-4  # real signal, not noise


def test_dense_and_moe_blocks_under_both_definitions():
    model = tiny_model("deepseek_v3").float()  # first two blocks dense, the last two MoE
    blocks = model.model.layers
    assert not hasattr(blocks[0].mlp, "experts") and hasattr(blocks[3].mlp, "experts")
    ids = _ids(256)
    pairs = pair_list("all", 4)
    slot = SwapEngine(model, ids, max_rows=4, max_live=6, kl_dtype=torch.float64)
    undefined = slot.undefined(pairs)
    mixed = {(i, j) for i, j in pairs if (i < 2) != (j < 2)}
    assert set(undefined) == mixed and all("differ in structure" in why and "--per-layer block" in why
                                           for why in undefined.values())
    with pytest.raises(ValueError, match="undefined"):
        slot.sweep([(1, 2)])
    like = [p for p in pairs if p not in mixed]
    ref_slot = reference_sweep(model, ids, pairs)
    assert set(ref_slot) == set(like)
    assert _worst(slot.sweep(like), ref_slot) < 1e-4
    # under "block" every pair is defined: an MoE block in a dense slot equals the plain module move
    block = SwapEngine(model, ids, max_rows=4, max_live=6, kl_dtype=torch.float64, per_layer="block")
    assert block.undefined(pairs) == {}
    got = block.sweep(pairs)
    ref_block = reference_sweep(model, ids, pairs, per_layer="block")
    assert _worst(got, ref_block) < 1e-4 and (1, 2) in ref_block
    # pairs of like blocks: the two definitions agree (no per-layer setting differs between these slots)
    assert max((got[p][k] - ref_slot[p][k]).abs().max().item() for p in like for k in ref_slot[p]) < 1e-5


def test_a_layer_index_constant_separates_the_definitions():
    model = tiny_model("diffllama").double()  # lambda_init = 0.8 - 0.6 exp(-0.3 layer_idx), per attention module
    ids = _ids(256)
    pairs = pair_list("all", 4)
    got = {pl: SwapEngine(model, ids, max_rows=4, max_live=6, kl_dtype=torch.float64, per_layer=pl).sweep(pairs)
           for pl in ("slot", "block")}
    for pl in got:
        assert _worst(got[pl], reference_sweep(model, ids, pairs, per_layer=pl)) < 1e-9
    rel = max(((got["slot"][p][k] - got["block"][p][k]).abs() / got["block"][p][k]).max().item()
              for p in pairs for k in got["block"][p])
    assert rel > 0.05  # the definitions differ by tens of percent here


@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_sublayers_under_both_definitions(unit):
    model = tiny_model("gemma3_text").double()  # sliding and full attention layers, sandwich norms
    ids = _ids(256)
    pairs = pair_list("all", 4)
    for pl in ("slot", "block"):
        got = SwapEngine(model, ids, max_rows=4, max_live=6, unit=unit, per_layer=pl, kl_dtype=torch.float64).sweep(pairs)
        assert _worst(got, reference_sweep(model, ids, pairs, unit=unit, per_layer=pl)) < 1e-9, pl


def test_score_records_the_definition_and_the_undefined_pairs(tmp_path, monkeypatch):
    from support.tiny_folder import tiny_checkpoint

    from swapkl.scoring.results import SwapResult
    from swapkl.scoring.score import score
    from swapkl.views.scores import heatmaps

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    ck = tiny_checkpoint("deepseek_v3", tmp_path / "ds3")
    slot = score(ck, Contract(pairs="all", prompts=3, tokens=8))
    block = score(ck, Contract(pairs="all", prompts=3, tokens=8, per_layer="block"))
    assert sorted(slot.pairs) == [(0, 1), (2, 3)] and len(slot.undefined) == 4  # dense 0-1, MoE 2-3
    assert block.undefined == {} and len(block.pairs) == 6
    assert slot.contract["per_layer"] == "slot" and block.contract["per_layer"] == "block"
    assert "per_layer" not in Contract().key("x") and Contract(per_layer="block").key("x")["per_layer"] == "block"
    back = SwapResult.from_json(slot.to_json())
    assert back.undefined == slot.undefined
    hover = heatmaps(slot).data[0].text
    assert hover[0][3].startswith("i = 0, j = 3<br>n/a: the blocks of layers 0 and 3 differ")
