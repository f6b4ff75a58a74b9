"""swapkl.model.units: the attention and MLP units of each family, as data, validated on the loaded model."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from conftest import tiny_model
from swapkl.errors import ContractError
from swapkl.model.architectures import block_call_args, locate
from swapkl.model.units import (LAYOUTS, UNITS, UnsupportedUnit, check_unit, layout_for, mixed_weights, unit_keys,
                                validate_layout, zero_out)

EXPECTED = {"llama": "pre-norm", "qwen3": "pre-norm", "gpt_neox": "gpt-neox", "gpt2": "gpt2"}


def _generic(mt: str, **kw):
    cfg = tf.AutoConfig.for_model(mt, num_hidden_layers=3, hidden_size=32, num_attention_heads=4, vocab_size=96,
                                  **kw)
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def test_each_family_names_its_layout_and_it_validates(family_model):
    kind, model = family_model
    loc = locate(model)
    layout = layout_for(model, loc)
    assert layout.name == EXPECTED[kind] == loc.family.units
    assert validate_layout(model, loc.blocks, layout) is None


def test_stories260k_layout(stories):
    loc = locate(stories.model)
    assert layout_for(stories.model, loc).name == "pre-norm"


def test_units_partition_a_block_so_both_units_swapped_is_the_block_swap(family_model):
    kind, model = family_model
    loc = locate(model)
    layout = layout_for(model, loc)
    b0 = loc.blocks[0]
    att, mlp = unit_keys(b0, layout, "attention"), unit_keys(b0, layout, "mlp")
    assert att and mlp and not att & mlp and att | mlp == unit_keys(b0, layout, "block")
    w0, w2 = (dict(loc.blocks[k].state_dict(keep_vars=True)) for k in (0, 2))
    both = mixed_weights(mixed_weights(w0, w2, att), w2, mlp)
    assert both.keys() == w2.keys() and all(both[k] is w2[k] for k in w2)
    only_att = mixed_weights(w0, w2, att)
    assert all((only_att[k] is w2[k]) == (k in att) for k in w0)


@torch.inference_mode()
def test_zeroing_a_units_projection_skips_it_llama(stories):
    """Llama: block(h) = h + a(h) + m(h + a(h)) with a = attn(norm1(.)), m = mlp(norm2(.)); zeroing the attention
    projection gives h + m(h), zeroing the MLP's gives h + a(h): computed here from the modules directly."""
    model = stories.model
    loc = locate(model)
    layout = layout_for(model, loc)
    args, kwargs = block_call_args(model, 7)
    blk = loc.blocks[1]
    h = torch.randn(1, 7, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    attn_out = blk.self_attn(blk.input_layernorm(h), **{k: v for k, v in kwargs.items()
                                                         if k in ("attention_mask", "position_embeddings")})[0]
    full = blk(h, *args, **kwargs)
    full = full[0] if isinstance(full, tuple) else full
    expect_full = h + attn_out + blk.mlp(blk.post_attention_layernorm(h + attn_out))
    assert torch.allclose(full, expect_full, atol=1e-5)
    for unit, expect in (("attention", h + blk.mlp(blk.post_attention_layernorm(h))), ("mlp", h + attn_out)):
        probe = copy.deepcopy(blk)
        zero_out(probe, layout, unit)
        out = probe(h, *args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        assert torch.allclose(out, expect, atol=1e-5), unit
    # the shared model's block is untouched (zero_out wrote only the copy)
    assert blk.self_attn.o_proj.weight.abs().sum() > 0


@pytest.mark.parametrize("mt, kw, layout", [
    ("gemma3_text", dict(num_key_value_heads=2, intermediate_size=64, head_dim=8), "sandwich"),
    ("opt", dict(ffn_dim=64, word_embed_proj_dim=32), "opt"),
    ("olmo", dict(num_key_value_heads=2, intermediate_size=64), "pre-norm"),
])
def test_generic_families_get_the_layout_that_validates(mt, kw, layout):
    model = _generic(mt, **kw)
    loc = locate(model)
    assert loc.family.generic and loc.family.units is None
    assert layout_for(model, loc).name == layout


def test_generic_family_without_valid_sublayers_is_refused_in_one_line():
    bloom = tiny_model("bloom")  # its attention module adds the residual inside: no residual branch to skip
    with pytest.raises(UnsupportedUnit, match=r"^attention/MLP units are not available for the 'generic:bloom' family") as e:
        layout_for(bloom, locate(bloom))
    assert "\n" not in str(e.value) and "--unit block" in str(e.value)
    # a layout whose "output projection" does not silence the branch fails the identity check
    from dataclasses import replace

    model = tiny_model("llama")
    loc = locate(model)
    good = LAYOUTS["pre-norm"]
    wrong = replace(good, attention=replace(good.attention, out=("self_attn.q_proj",)))
    assert validate_layout(model, loc.blocks, good) is None
    assert "not the identity" in validate_layout(model, loc.blocks, wrong)


def test_a_listed_family_without_units_is_refused():
    from dataclasses import replace

    model = tiny_model("llama")
    loc = locate(model)
    bare = type(loc)(replace(loc.family, units=None), loc.blocks, loc.final_norm, loc.head)
    with pytest.raises(UnsupportedUnit, match="'llama' family .*no sublayer layout"):
        layout_for(model, bare)


def test_unknown_unit_is_a_one_line_contract_error():
    assert [check_unit(u) for u in UNITS] == list(UNITS)
    with pytest.raises(ContractError, match=r"^unknown unit 'ffn'; choose one of: block, attention, mlp$"):
        check_unit("ffn")
    with pytest.raises(ContractError):
        LAYOUTS["pre-norm"].spec("heads")
