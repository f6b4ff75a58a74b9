"""One tiny-model builder (:mod:`swapkl.model.tiny`): the suite's family models (``tests/conftest.py``) are its
configs with explicit sizes, and the sweep's models its generic shrinking."""
from __future__ import annotations

import pytest

from conftest import family_sizes, tiny_config, tiny_model


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox"])
def test_the_suite_family_configs_have_the_sizes_it_states(kind):
    cfg = tiny_config(kind, num_layers=3)
    text = cfg.to_dict()
    assert cfg.num_hidden_layers == 3 and cfg.hidden_size == 32 and cfg.vocab_size == 96
    assert cfg.num_attention_heads == 4 and cfg.bos_token_id == 0 and cfg.eos_token_id == 0
    assert cfg.max_position_embeddings == 256
    assert not hasattr(cfg, "_attn_implementation_internal") or cfg._attn_implementation_internal is None
    if kind == "gpt2":
        assert text["n_positions"] == 256 and text["n_inner"] is None
    else:
        assert cfg.intermediate_size == 64
    if kind == "gpt_neox":
        assert cfg.rope_parameters["partial_rotary_factor"] == 0.25
    if kind not in ("gpt2", "gpt_neox"):
        assert cfg.num_key_value_heads == 2 and cfg.pad_token_id == 0
    if kind == "qwen3":
        assert cfg.head_dim == 8


def test_sizes_replace_the_generic_shrinking_and_resolve_aliases():
    from swapkl.model.tiny import tiny_config as build

    cfg = build("gpt2", 2, sizes={"num_hidden_layers": "L", "hidden_size": 16, "num_attention_heads": 2})
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head) == (2, 16, 2)
    assert cfg.vocab_size == type(cfg)().vocab_size  # the rest: the class's defaults
    assert cfg._attn_implementation == "eager"
    generic = build("gpt2", 2)
    assert (generic.n_layer, generic.n_embd, generic.vocab_size, generic.bos_token_id) == (2, 64, 256, 1)


def test_the_suite_family_model_is_the_builders_model():
    import torch

    from swapkl.model.tiny import tiny_model as build

    a = tiny_model("llama", num_layers=2, seed=3, hidden=64)
    b = build("llama", 2, seed=3, sizes=family_sizes("llama", 96, 64), attention=None, dtype=None)
    assert a.config.to_dict() == b.config.to_dict() and "dtype" not in {k for k, v in a.config.to_dict().items() if v}
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not a.training and next(a.parameters()).dtype == torch.float32
