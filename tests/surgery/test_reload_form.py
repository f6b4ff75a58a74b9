"""The export of a shortened model reloads as the plain removal where the config (and the weights) can say so, and is
refused in one line where they cannot: position constants carried into the weights (DiffLlama), settings the reload
derives anew that change no output (Gemma-4's KV store flag without readers, MiniMax's saved decay buffers), the
wrapper config of a text-config model (Emu3), layer indices held by modules and in tie declarations (Zamba, Zamba2)."""
from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

from swapkl.model.config_cut import cut_config, structure_difference
from swapkl.model.tiny import scale_matrices, tiny_config
from swapkl.support.check import plain_removal, widest
from swapkl.surgery.prune import PruneError, pruned_copy, save_pruned
from swapkl.surgery.reload_form import CONSTANTS, with_dot

IDS = torch.randint(3, 200, (2, 10), generator=torch.Generator().manual_seed(1))


def tiny(model_type: str, layers: int = 4, drop=(), **override):
    """A tiny random ``model_type`` (weights ×3, as the family sweep's) with config ``override`` and without the keys
    ``drop`` (the config derives them), in the widest dtype its forward runs in; ``(model, dtype)``."""
    cfg = tiny_config(model_type, 4)
    d = {k: v for k, v in cfg.to_dict().items() if k not in drop} | {"num_hidden_layers": layers} | override
    cfg = type(cfg).from_dict(d)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    scale_matrices(model)
    return widest(model, IDS)


def export_error(model, dtype, remove, folder) -> float:
    """Relative max difference between the reloaded export without ``remove`` (stock transformers, eager attention)
    and the plain removal (the blocks passing their input on)."""
    want = plain_removal(model, IDS, remove).double()
    out = save_pruned(model, list(remove), folder)
    back = tf.AutoModelForCausalLM.from_pretrained(out, dtype=dtype, attn_implementation="eager").eval()
    with torch.inference_mode():
        got = back(input_ids=IDS, use_cache=False).logits.double()
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.mark.parametrize("remove", [(0,), (2, 4), (0, 1, 2, 3)])
def test_diffllama_export_carries_lambda_init_into_the_weights(remove, tmp_path):
    model, dtype = tiny("diffllama", 6)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert export_error(model, dtype, remove, tmp_path / "x") < 1e-6
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the caller's weights untouched
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x", dtype=dtype)
    kept = [i for i in range(6) if i not in remove]
    moved = [(pos, old) for pos, old in enumerate(kept) if pos != old]
    pos, old = moved[0]  # a block that moved: the reload derives another λ_init, and other λ weights and o_proj
    a, b = model.model.layers[old].self_attn, back.model.layers[pos].self_attn
    assert b.lambda_init != a.lambda_init
    assert not torch.equal(a.o_proj.weight, b.o_proj.weight)
    assert torch.allclose(a.o_proj.weight * (1 - a.lambda_init), b.o_proj.weight * (1 - b.lambda_init), rtol=1e-12)


@pytest.mark.parametrize("q, k", [([0.3, -0.2, 0.5], [0.1, 0.4, -0.2]), ([0.3, -0.2, 0.5], [0.0, 0.0, 0.0]),
                                  ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])])
@pytest.mark.parametrize("target", [-1.5, 0.7])
def test_with_dot_reaches_the_target_dot_product(q, k, target):
    q2, k2 = with_dot(torch.tensor(q, dtype=torch.float64), torch.tensor(k, dtype=torch.float64), target)
    assert float((q2 * k2).sum()) == pytest.approx(target, abs=1e-12)


def test_a_constant_without_the_weights_that_absorb_it_is_refused_in_one_line():
    with pytest.raises(PruneError) as e:
        CONSTANTS["lambda_init"].carry(torch.nn.Linear(2, 2), 0.3)
    assert "lambda_init" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("remove", [(1, 2), (4,), (2, 3)])
def test_gemma4_store_flag_moves_without_readers_and_the_export_is_exact(remove, tmp_path):
    types = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "sliding_attention",
             "full_attention"]
    model, dtype = tiny("gemma4_text", 6, drop=("per_layer_config",), layer_types=types)
    assert [b.self_attn.store_full_length_kv for b in model.model.layers] == [False] * 4 + [True, True]
    assert export_error(model, dtype, remove, tmp_path / "x") < 1e-6


def test_gemma4_store_flag_is_compared_where_a_layer_reads_it():
    """Six layers, the last two reading the keys and values stored by layers 1 (full) and 3 (sliding); without layer 3
    the shortened config makes layer 2 the store: refused in one line (the readers would read another layer)."""
    cfg = {k: v for k, v in tiny_config("gemma4_text", 4).to_dict().items() if k != "per_layer_config"} | {
        "num_hidden_layers": 6, "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                        "sliding_attention", "full_attention"]}
    full = type(tiny_config("gemma4_text", 4)).from_dict(cfg)
    assert full.kv_sharing_modes == [None, "store", None, "store", "reuse", "reuse"]
    with torch.device("meta"):
        blocks = tf.AutoModelForCausalLM.from_config(full).model.layers
    keep = [0, 1, 2, 4, 5]
    cut = type(full).from_dict(cfg | {"num_hidden_layers": 5, "layer_types": [cfg["layer_types"][i] for i in keep]})
    why = structure_difference([blocks[i] for i in keep], keep, cut, "model.layers")
    assert why == ("layer 2 would come back with self_attn.store_full_length_kv = True, not False (a setting the "
                   "config derives from the layer's position)")


def test_minimax_decay_buffers_travel_with_the_export(tmp_path):
    model, dtype = tiny("minimax", 4)
    assert export_error(model, dtype, (1,), tmp_path / "x") < 1e-4
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x", dtype=dtype)
    assert torch.equal(back.model.layers[2].self_attn.slope_rate, model.model.layers[3].self_attn.slope_rate)


def test_minimax_decay_setting_is_compared_when_its_buffers_are_not_saved():
    model, _ = tiny("minimax", 4)
    copy = pruned_copy(model, [1])
    attn = copy.model.layers[2].self_attn  # old layer 3, a lightning-attention layer
    attn._non_persistent_buffers_set = {"slope_rate", "query_decay", "key_decay", "diagonal_decay"}
    cfg = cut_config(model.config, [0, 2, 3], 4)
    why = structure_difference(list(copy.model.layers), [0, 2, 3], cfg, "model.layers")
    assert why is not None and why.startswith("layer 3 would come back with ")


def test_beam_depth_scaled_residual_is_refused_in_one_line(tmp_path):
    """Beam scales the residual stream itself by sqrt((n-1)/n), n from the layer's index: no weight of the block
    multiplies the stream, so a moved block cannot keep its function."""
    model, _ = tiny("beam", 4)
    with pytest.raises(PruneError) as e:
        save_pruned(model, [1], tmp_path / "x")
    assert str(e.value) == ("cannot export the model without layers [1]: layer 2 would come back with "
                            "attn_residual_add_idx = 4, not 6 (a setting the config derives from the layer's position)")


def test_emu3_export_writes_the_wrapper_config_that_reloads_its_class(tmp_path):
    model, dtype = tiny("emu3", 4)
    assert type(model.config).__name__ == "Emu3TextConfig"
    assert export_error(model, dtype, (1, 2), tmp_path / "x") < 1e-6
    saved = json.loads((tmp_path / "x" / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"], saved["dtype"]) == ("emu3", ["Emu3ForCausalLM"], "float64")
    assert saved["text_config"]["num_hidden_layers"] == 2
    assert next(tf.AutoModelForCausalLM.from_pretrained(tmp_path / "x").parameters()).dtype == torch.float64


HYBRID3 = ["linear_attention", "hybrid"] * 3


@pytest.mark.parametrize("remove", [(0,), (2, 4)])
def test_zamba2_adapter_map_and_ties_follow_the_kept_layers(remove, tmp_path):
    """Three hybrid layers sharing two blocks: removing others renumbers each module's map of hybrid layers (in
    memory) and the tie declarations (saved)."""
    model, dtype = tiny("zamba2", 6, hybrid_layer_ids=[1, 3, 5], layers_block_type=HYBRID3, num_mem_blocks=2)
    with torch.inference_mode():
        mem = pruned_copy(model, list(remove))(input_ids=IDS, use_cache=False).logits
    assert torch.equal(mem, plain_removal(model, IDS, remove))
    assert export_error(model, dtype, remove, tmp_path / "x") < 1e-6


def test_zamba2_removing_a_hybrid_layer_is_refused_in_one_line(tmp_path):
    model, _ = tiny("zamba2", 6, hybrid_layer_ids=[1, 3, 5], layers_block_type=HYBRID3, num_mem_blocks=2)
    with pytest.raises(PruneError) as e:
        save_pruned(model, [1], tmp_path / "x")
    assert str(e.value).startswith("cannot export the model without layers [1]: layer 3 would come back with other "
                                   "weights (shared_transformer.feed_forward.gate_up_proj_adapter_list.")


def test_zamba_ties_follow_the_kept_layers_and_a_single_hybrid_layer_is_refused(tmp_path):
    model, dtype = tiny("zamba", 6, layers_block_type=HYBRID3)
    assert export_error(model, dtype, (0, 1), tmp_path / "x") < 1e-6
    with pytest.raises(PruneError) as e:  # one hybrid layer left: stock transformers cannot build it
        save_pruned(model, [1, 3], tmp_path / "y")
    assert "the shortened config does not build (ValueError: There is an issue with your definition of " \
           "`tie_weights_keys`" in str(e.value) and "\n" not in str(e.value)


def test_every_export_of_a_shortened_stack_takes_the_same_step(tmp_path):
    """The folded bridged export and the sublayer export delete blocks too: they carry DiffLlama's λ_init into the
    weights as save_pruned does (without it, the moved blocks reload with another λ_init and other logits), and
    refuse what the config cannot describe in one line, nothing written."""
    import numpy as np

    from swapkl.repair.bridge import Bridge, bridged_model
    from swapkl.repair.export import save_bridged
    from swapkl.surgery.removal_set import RemovalSet
    from swapkl.surgery.skip import zeroed_copy

    model, dtype = tiny("diffllama", 5)
    d = model.config.hidden_size
    w = np.eye(d) + 0.05 * np.random.default_rng(0).standard_normal((d, d))
    bridge = Bridge(1, 2, "folded", w)
    folder = save_bridged(model, [bridge], tmp_path / "b")
    back = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()
    with torch.inference_mode():
        want = bridged_model(model, [bridge])(input_ids=IDS, use_cache=False).logits.double()
        got = back(input_ids=IDS, use_cache=False).logits.double()
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5
    assert back.model.layers[1].self_attn.lambda_init != model.model.layers[2].self_attn.lambda_init

    rs = RemovalSet([(1, "block"), (3, "mlp")])  # a mixed set: the sublayer export, one block deleted
    out = save_pruned(model, rs, tmp_path / "s")
    back = tf.AutoModelForCausalLM.from_pretrained(out, dtype=dtype, attn_implementation="eager").eval()
    with torch.inference_mode():
        want = zeroed_copy(model, rs.validate(5))(input_ids=IDS, use_cache=False).logits.double()
        got = back(input_ids=IDS, use_cache=False).logits.double()
    assert back.config.num_hidden_layers == 4
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5

    from swapkl.surgery.reload_form import prepare_export

    beam, _ = tiny("beam", 4)
    with pytest.raises(PruneError) as e:
        prepare_export(beam, pruned_copy(beam, [1]), [1])
    assert str(e.value).startswith("cannot export the model without layers [1]: layer 2 would come back with ")
    assert "\n" not in str(e.value)
