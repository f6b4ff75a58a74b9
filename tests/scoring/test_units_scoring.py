"""Both protocols per sublayer unit: the engine against the plain reference (weights copied into place by
load_state_dict, full forwards) on a tiny model of each family and on stories260K; both units moved together are
the block moved; unit=block is what it always was."""
from __future__ import annotations

import pytest
import torch

from swapkl.contract import pair_list
from swapkl.model.architectures import block_call_args, locate
from swapkl.model.units import layout_for, mixed_weights, unit_keys
from swapkl.model.tiny import scale_matrices
from swapkl.scoring.engine import SwapEngine
from swapkl.scoring.reference import PlainReference, reference_sweep

KINDS = ("repl_ij", "repl_ji", "inter")


def _ids(vocab: int, P: int = 3, T: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, vocab, (P, T), generator=torch.Generator().manual_seed(seed))


def _worst(got: dict, ref: dict) -> float:
    return max((got[p][k].double() - ref[p][k].double()).abs().max().item() for p in ref for k in KINDS)


@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_engine_equals_plain_reference_per_unit(family_model, unit):
    kind, model = family_model
    ids = _ids(model.config.vocab_size)
    pairs = pair_list("all", 4)
    for positions in ("all", "last"):
        got = SwapEngine(model, ids, positions=positions, max_live=4, max_rows=2, unit=unit).sweep(pairs)
        ref = reference_sweep(model, ids, pairs, positions=positions, unit=unit)
        assert _worst(got, ref) < 1e-5, (kind, unit, positions)
        # the variants are far from the baseline (the comparison is not of zeros)
        assert min(ref[p][k].mean().item() for p in pairs for k in KINDS) > 1e-3
    # and a sublayer is not the block: the unit changes the numbers
    block = SwapEngine(model, ids, unit="block").sweep(pairs)
    assert _worst(got, block) > 1e-3


@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_stories260k_per_unit(stories, unit):
    model = stories.model
    ids = _ids(model.config.vocab_size, P=2, T=12)
    pairs = pair_list("all", stories.num_layers)
    got = SwapEngine(model, ids, max_live=6, max_rows=3, unit=unit).sweep(pairs)
    ref = reference_sweep(model, ids, pairs, unit=unit)
    assert _worst(got, ref) < 1e-5
    assert min(ref[p][k].mean().item() for p in pairs for k in KINDS) > 1e-4


def test_both_units_moved_are_the_block_moved(family_model):
    """Replacement of the attention unit then of the MLP unit (weights copied one unit after the other, plain
    forwards) equals the engine's block replacement, and exchanging both units equals the block interchange."""
    kind, model = family_model
    ids = _ids(model.config.vocab_size)
    pairs = [(0, 1), (1, 3), (0, 3)]
    block = SwapEngine(model, ids, unit="block").sweep(pairs)
    ref = PlainReference(model, ids)
    mlp = unit_keys(ref.blocks[0], layout_for(model, locate(model)), "mlp")
    for i, j in pairs:
        # slot i takes block j's attention (plain reference), then block j's MLP on top of that
        ij = mixed_weights(ref.unit_weights(i, j, "attention"), ref.original[j], mlp)
        ji = mixed_weights(ref.unit_weights(j, i, "attention"), ref.original[i], mlp)
        assert all(torch.equal(ij[k], ref.original[j][k]) for k in ij)
        got = {"repl_ij": ref.kl({i: ij}), "repl_ji": ref.kl({j: ji}), "inter": ref.kl({i: ij, j: ji})}
        for k in KINDS:
            assert (got[k] - block[(i, j)][k].double()).abs().max().item() < 1e-5, (kind, i, j, k)


def test_unit_block_is_unchanged(family_model):
    """unit="block" runs exactly today's sweep: bit-identical to an engine built without the argument, and equal
    to the plain block reference."""
    kind, model = family_model
    ids = _ids(model.config.vocab_size)
    pairs = pair_list("gap:2", 4)
    before = SwapEngine(model, ids, max_live=4).sweep(pairs)
    now = SwapEngine(model, ids, max_live=4, unit="block").sweep(pairs)
    assert all(torch.equal(before[p][k], now[p][k]) for p in pairs for k in KINDS)
    assert _worst(now, reference_sweep(model, ids, pairs)) < 1e-5


@torch.inference_mode()
def test_gpt_neox_parallel_residual_moves_one_branch():
    """GPT-NeoX reads the block input in both sublayers: slot i with block j's attention is
    h + attn_j(ln1_j(h)) + mlp_i(ln2_i(h)), computed here from the modules directly."""
    from conftest import tiny_model
    from swapkl.scoring.slots import BlockRunner

    model = tiny_model("gpt_neox")
    assert model.config.use_parallel_residual
    runner = BlockRunner(model, "attention")
    base = runner.baseline(_ids(model.config.vocab_size, P=1, T=7))
    h = base.states[1]
    bi, bj = runner.blocks[1], runner.blocks[3]
    args, kwargs = block_call_args(model, 7)
    kw = {k: v for k, v in kwargs.items() if k in ("attention_mask", "position_embeddings")}
    attn_j = bj.attention(bj.input_layernorm(h), **kw)[0]  # no KV cache: layer_idx does not enter the output
    expect = h + attn_j + bi.mlp(bi.post_attention_layernorm(h))
    got = runner.run_slot(1, 3, h)
    assert torch.allclose(got, expect, atol=1e-5)
    assert not torch.allclose(got, runner.run_slot(1, 1, h), atol=1e-3)


@pytest.mark.parametrize("mt, kw", [
    ("gemma3_text", dict(num_key_value_heads=2, intermediate_size=64, head_dim=8, sliding_window=4,
                         layer_types=["sliding_attention", "full_attention"] * 2)),
    ("opt", dict(ffn_dim=64, word_embed_proj_dim=32)),
])
def test_generic_layouts_equal_the_plain_reference(mt, kw):
    """Families found by the generic fallback whose layout validates: Gemma 3 (sandwich norms carried by each
    unit; sliding and full attention per slot, so the slot's attention type stays the slot's) and OPT."""
    import transformers as tf

    cfg = tf.AutoConfig.for_model(mt, num_hidden_layers=4, hidden_size=32, num_attention_heads=4, vocab_size=96,
                                  **kw)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    scale_matrices(model)
    ids = _ids(96)
    pairs = pair_list("all", 4)
    for unit in ("attention", "mlp"):
        got = SwapEngine(model, ids, max_live=4, max_rows=2, unit=unit).sweep(pairs)
        ref = reference_sweep(model, ids, pairs, unit=unit)
        assert _worst(got, ref) < 1e-5, (mt, unit)
        assert min(ref[p][k].mean().item() for p in pairs for k in KINDS) > 1e-4


def test_a_sublayer_sweep_runs_the_block_sweeps_calls(stories):
    """Prefix reuse, the shared branch and the batching are the block sweep's: the same prompt-block calls (fewer
    than the naive 1 + 3|S| full forwards), the same baseline pass."""
    ids = _ids(stories.model.config.vocab_size, P=2, T=8)
    pairs = pair_list("all", stories.num_layers)
    stats = {}
    for unit in ("block", "attention", "mlp"):
        eng = SwapEngine(stories.model, ids, max_live=6, unit=unit)
        eng.sweep(pairs)
        stats[unit] = (eng.stats.block_calls, eng.stats.baseline_block_calls, eng.stats.naive_block_calls)
    assert stats["attention"] == stats["mlp"] == stats["block"]
    assert stats["block"][0] < stats["block"][2]
