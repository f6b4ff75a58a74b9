"""Sublayer layouts found on the model (swapkl.model.unit_discovery) for blocks whose modules carry other names:
the layout found is the one the block's code runs, skipping a unit equals zeroing its projection and both equal
running the block without that residual branch, and a block whose module adds the residual inside is refused."""
from __future__ import annotations

import pytest
import torch

from swapkl.errors import SwapklError


def _tiny(model_type):
    from swapkl.support.check import tiny_for_check

    return tiny_for_check(model_type)


@pytest.mark.parametrize("model_type, attention, mlp, shared", [
    ("starcoder2", ("input_layernorm", "self_attn"), ("post_attention_layernorm", "mlp"), ()),
    ("olmo2", ("self_attn", "post_attention_layernorm"), ("mlp", "post_feedforward_layernorm"), ()),
    ("falcon", ("input_layernorm", "self_attention"), ("mlp",), ("input_layernorm",)),
    ("qwen2_moe", ("input_layernorm", "self_attn"), ("post_attention_layernorm", "mlp"), ()),
    ("deepseek_v3", ("input_layernorm", "self_attn"), ("post_attention_layernorm", "mlp"), ()),
])
def test_found_layout_and_skipping(model_type, attention, mlp, shared):
    from swapkl.model.architectures import locate
    from swapkl.model.units import layout_for
    from swapkl.surgery.removal_set import RemovalSet
    from swapkl.surgery.skip import skipping_copy, zeroed_copy

    model, ids, _ = _tiny(model_type)
    loc = locate(model)
    layout = layout_for(model, loc)
    assert layout.name == "found"
    assert layout.attention.modules == attention and layout.mlp.modules == mlp
    assert layout.attention.shared == shared
    if model_type == "qwen2_moe":  # the experts' stacked down projections and the shared expert's
        assert layout.mlp.out == ("mlp.experts.down_proj", "mlp.shared_expert.down_proj")
    if model_type == "deepseek_v3":  # a dense block, then MoE blocks: the projections of both structures
        assert layout.mlp.out == ("mlp.down_proj", "mlp.experts.down_proj", "mlp.shared_experts.down_proj")
    blocks = loc.blocks
    for layer, unit, spec in ((1, "attention", layout.attention), (1, "mlp", layout.mlp), (0, "mlp", layout.mlp)):
        # the plain removal of one residual branch: the core's output replaced by zeros through a hook
        def zero(mod, args, out):
            return (torch.zeros_like(out[0]), *out[1:]) if isinstance(out, tuple) else torch.zeros_like(out)

        h = blocks[layer].get_submodule(spec.core).register_forward_hook(zero)
        try:
            with torch.inference_mode():
                want = model(input_ids=ids, use_cache=False).logits
        finally:
            h.remove()
        rs = RemovalSet([(layer, unit)])
        with torch.inference_mode():
            skipped = skipping_copy(model, rs)(input_ids=ids, use_cache=False).logits
            zeroed = zeroed_copy(model, rs)(input_ids=ids, use_cache=False).logits
            full = model(input_ids=ids, use_cache=False).logits
        torch.testing.assert_close(skipped, want, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(zeroed, want, rtol=1e-9, atol=1e-9)
        assert (full - want).abs().max() > 1e-3  # the branch mattered


@pytest.mark.parametrize("model_type, why", [
    ("bloom", "skipping its attention is not zeroing 'self_attention.dense'"),
    ("qwen3_next", "'linear_attn' returns a tensor"),  # linear and full attention: no one layout
])
def test_found_layout_refused(model_type, why):
    from swapkl.model.architectures import locate
    from swapkl.model.units import layout_for

    model, _, _ = _tiny(model_type)
    with pytest.raises(SwapklError, match="attention/MLP units are not available") as e:
        layout_for(model, locate(model))
    assert why in str(e.value) and "\n" not in str(e.value)
