"""Layer removal: equals skipping blocks, never mutates the input, exports reload with identical logits."""
from __future__ import annotations


import pytest
import torch

from conftest import FAMILY_NAMES, tiny_config, tiny_model
from swapkl.model import architectures as arch
from swapkl.surgery.prune import PruneError, pruned_copy, read_prune_record, save_pruned




def skipped_logits(model, remove, x):
    """Plain reference: the unmodified model with the removed blocks turned into identities by hooks."""
    blocks = arch.locate(model).blocks
    handles, saved = [], {}
    for k in remove:
        def pre(mod, args, kwargs, k=k):
            saved[k] = args[0] if args else kwargs["hidden_states"]

        def post(mod, args, kwargs, out, k=k):
            h = saved.pop(k)
            return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h
        handles += [blocks[k].register_forward_pre_hook(pre, with_kwargs=True),
                    blocks[k].register_forward_hook(post, with_kwargs=True)]
    try:
        with torch.no_grad():
            return model(input_ids=x, use_cache=False).logits
    finally:
        for h in handles:
            h.remove()


def _state(model):
    loc = arch.locate(model)
    idx = [tuple(getattr(arch.get_path(b, p.rpartition(".")[0]) if "." in p else b, p.rpartition(".")[2], None)
                 for p in loc.family.layer_idx_attrs) for b in loc.blocks]
    return len(loc.blocks), arch.num_layers_in_config(model.config, loc.family), idx, id(loc.blocks)


def check_family(model, remove, tmp_path, vocab):
    x = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=x, use_cache=False).logits
    state = _state(model)
    pm = pruned_copy(model, remove)
    loc = arch.locate(pm)  # also checks config count == block count
    L = state[0]
    assert loc.num_layers == L - len(remove)
    for pos, b in enumerate(loc.blocks):
        for p in loc.family.layer_idx_attrs:
            parent = arch.get_path(b, p.rpartition(".")[0]) if "." in p else b
            if parent is not None and hasattr(parent, p.rpartition(".")[2]):
                assert getattr(parent, p.rpartition(".")[2]) == pos
    # parameters are shared, not copied
    keep = [i for i in range(L) if i not in remove]
    src_blocks = arch.locate(model).blocks
    for pos, k in enumerate(keep):
        a = next(loc.blocks[pos].parameters())
        assert a is next(src_blocks[k].parameters())
        assert loc.blocks[pos] is not src_blocks[k]
    with torch.no_grad():
        got = pm(input_ids=x, use_cache=False).logits
    ref = skipped_logits(model, remove, x)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    # the input model is untouched: same blocks, config, layer_idx, logits
    assert _state(model) == state
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x, use_cache=False).logits, before, rtol=0, atol=0)
    # export and reload
    out = save_pruned(model, remove, tmp_path / "p", identity={"id": "test-model"})
    rec = read_prune_record(out)
    assert rec["removed"] == sorted(remove) and rec["kept"] == keep and rec["source"] == {"id": "test-model"}
    assert (out / "model.safetensors").is_file()
    import transformers as tf
    re = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    assert arch.locate(re).num_layers == L - len(remove)
    with torch.no_grad():
        torch.testing.assert_close(re(input_ids=x, use_cache=False).logits, got, rtol=0, atol=1e-6)
    # generation with a KV cache: reloaded == in-memory pruned == pruned without cache
    g_kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        g1 = re.generate(x[:1], use_cache=True, **g_kw)
        g2 = pm.generate(x[:1], use_cache=True, **g_kw)
        g3 = pm.generate(x[:1], use_cache=False, **g_kw)
    assert torch.equal(g1, g2) and torch.equal(g2, g3)
    assert _state(model) == state


@pytest.mark.parametrize("kind", FAMILY_NAMES)
def test_family_prune(kind, tmp_path):
    check_family(tiny_model(kind, num_layers=5), [1, 3], tmp_path, 96)


def test_stories_prune(stories_path, tmp_path):
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(stories_path).eval()
    check_family(model, [2], tmp_path, 512)


def test_qwen3_mixed_layer_types(tmp_path):
    """Per-layer config lists are cut with the blocks (Qwen3 refuses to save otherwise)."""
    import transformers as tf

    cfg = tiny_config("qwen3", num_layers=4)
    cfg.layer_types = ["full_attention", "sliding_attention", "full_attention", "sliding_attention"]
    cfg.sliding_window = 4
    cfg.use_sliding_window = True
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    pm = pruned_copy(model, [0])
    assert pm.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert model.config.layer_types[0] == "full_attention" and model.config.num_hidden_layers == 4
    x = torch.randint(0, 96, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(pm(input_ids=x, use_cache=False).logits, skipped_logits(model, [0], x),
                                   rtol=0, atol=1e-5)
    out = save_pruned(model, [0], tmp_path / "q")
    re = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    assert re.config.layer_types == pm.config.layer_types
    with torch.no_grad():
        torch.testing.assert_close(re(input_ids=x, use_cache=False).logits, pm(input_ids=x, use_cache=False).logits,
                                   rtol=0, atol=1e-6)


def test_gpt2_inverse_layer_idx_scaling(tmp_path):
    """A slot-dependent attention scale follows the new slot, as it does after a reload."""
    import transformers as tf

    cfg = tiny_config("gpt2", num_layers=4)
    cfg.scale_attn_by_inverse_layer_idx = True
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    pm = pruned_copy(model, [0, 2])
    out = save_pruned(model, [0, 2], tmp_path / "g")
    re = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    x = torch.randint(0, 96, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(re(input_ids=x, use_cache=False).logits, pm(input_ids=x, use_cache=False).logits,
                                   rtol=0, atol=1e-6)
    assert model.transformer.h[1].attn.scaling == pytest.approx(8 ** -0.5 / 2)  # original untouched


def test_hooks_do_not_leak_and_quantizer_removed_on_copy(tmp_path):
    model = tiny_model("llama")
    pm = pruned_copy(model, [])
    h = pm.model.layers[0].register_forward_hook(lambda *a: None)
    assert not model.model.layers[0]._forward_hooks and pm.model.layers[0]._forward_hooks
    h.remove()

    class FakeQuantizer:
        calls = []

        def remove_quantization_config(self, m):
            FakeQuantizer.calls.append(m)
            del m.hf_quantizer

    model.hf_quantizer = FakeQuantizer()
    save_pruned(model, [1], tmp_path / "f")
    assert FakeQuantizer.calls and FakeQuantizer.calls[0] is not model
    assert isinstance(model.hf_quantizer, FakeQuantizer)  # the caller's model keeps its quantizer


@pytest.mark.parametrize("remove,msg", [([7], "out of range"), ([0, 1, 2, 3], "cannot remove all"),
                                         (["x"], "integers")])
def test_bad_removal(remove, msg):
    with pytest.raises(PruneError, match=msg):
        pruned_copy(tiny_model("gpt2"), remove)
