"""Removing attention / MLP sublayers: the skipping runtime and the zeroed-projection export form both equal a plain
reference (a deep copy with the unit's output projection zeroed in place, full forward), on a tiny model of each
family and on stories260K; block removal through the new path is today's, bit for bit; a cached decode of the
skipping model equals its full forward."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import FAMILY_NAMES, tiny_model
from swapkl.model import architectures as arch
from swapkl.model.units import layout_for
from swapkl.surgery.blocks import pruned_copy
from swapkl.surgery.removal_set import PruneError, RemovalSet
from swapkl.surgery.skip import SkippedSublayer, removed_copy, skipping_copy, zeroed_copy
from support.tensors import logits

TOL = 1e-5


def _plain(model, items):
    """The obviously correct removal: a deep copy, each removed sublayer's output projection zeroed in place
    (weight and bias), then the removed blocks deleted by the block path."""
    m = copy.deepcopy(model)
    loc = arch.locate(m)
    layout = layout_for(model, arch.locate(model))
    with torch.no_grad():
        for layer, unit in items:
            if unit == "block":
                continue
            for path in layout.spec(unit).out:
                mod = arch.get_path(loc.blocks[layer], path)
                mod.weight.zero_()
                if getattr(mod, "bias", None) is not None:
                    mod.bias.zero_()
    return pruned_copy(m, [layer for layer, u in items if u == "block"])


def _check(model, items, vocab):
    x = torch.randint(0, vocab, (2, 11), generator=torch.Generator().manual_seed(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref = logits(_plain(model, items), x)
    rs = RemovalSet(items)
    skip = logits(skipping_copy(model, rs), x)
    zero = logits(zeroed_copy(model, rs), x)
    assert (skip - ref).abs().max() < TOL
    assert (zero - ref).abs().max() < TOL
    assert (logits(model, x) - ref).abs().max() > 1e-3  # the removal changes something
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the caller's model is untouched


@pytest.mark.parametrize("kind", FAMILY_NAMES)
@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_skip_equals_zeroed_equals_plain(kind, unit):
    model = tiny_model(kind)
    _check(model, [(0, unit), (2, unit)], 96)


@pytest.mark.parametrize("kind", FAMILY_NAMES)
def test_mixed_set_with_a_block(kind):
    model = tiny_model(kind)
    _check(model, [(1, "attention"), (2, "block"), (3, "mlp")], 96)


def test_stories260k(stories):
    vocab = stories.model.config.vocab_size
    for items in ([(0, "attention"), (3, "attention")], [(1, "mlp"), (4, "mlp")], [(0, "attention"), (2, "block")]):
        _check(stories.model, items, vocab)


def test_skipped_core_is_replaced_and_original_kept():
    model = tiny_model("llama")
    sk = skipping_copy(model, [1], "attention")
    assert isinstance(arch.locate(sk).blocks[1].self_attn, SkippedSublayer)
    assert not isinstance(arch.locate(model).blocks[1].self_attn, SkippedSublayer)


@pytest.mark.parametrize("kind", FAMILY_NAMES)
def test_block_removal_is_unchanged(kind):
    model = tiny_model(kind)
    x = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(2))
    a = logits(removed_copy(model, [1, 2]), x)
    b = logits(pruned_copy(model, [1, 2]), x)
    assert torch.equal(a, b)


@pytest.mark.parametrize("kind", FAMILY_NAMES)
def test_cached_decode_of_the_skipping_model(kind):
    """Token-by-token decoding with a KV cache (the first attention skipped, so the cache holds only the kept
    attentions) gives the full forward's logits."""
    model = tiny_model(kind)
    sk = skipping_copy(model, [0, 2], "attention")
    x = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(3))
    full = logits(sk, x)
    with torch.no_grad():
        out, past = arch.cached_forward(sk, x[:, :6])
        steps = [out.logits[:, -1]]
        for t in range(6, 10):
            out, past = arch.cached_forward(sk, x[:, t:t + 1], past)
            steps.append(out.logits[:, -1])
    got = torch.stack(steps[:-1], 1)
    assert (got - full[:, 5:9]).abs().max() < 1e-4
    assert (steps[-1] - full[:, 9]).abs().max() < 1e-4


def test_removal_set_normal_form_and_checks():
    assert RemovalSet([(3, "attention"), (3, "mlp")]) == RemovalSet.of([3])
    assert RemovalSet([(3, "attention"), (3, "block")]).to_list() == [[3, "block"]]
    rs = RemovalSet([(5, "mlp"), (2, "attention")])
    assert rs.unit == "mixed" and rs.layers("mlp") == [5] and rs.label() == "attention 2; mlp 5"
    assert RemovalSet.from_list(rs.to_list()) == rs
    assert RemovalSet.of([1, 2], "mlp").unit == "mlp"
    with pytest.raises(PruneError, match="unknown unit"):
        RemovalSet([(1, "ffn")])
    with pytest.raises(PruneError, match="out of range"):
        RemovalSet.of([9], "attention").validate(4)
    with pytest.raises(PruneError, match="cannot remove all"):
        RemovalSet.of(range(4)).validate(4)
    RemovalSet.of(range(4), "attention").validate(4)  # every attention may go: the MLPs stay


def test_cached_forward_decodes_as_the_full_forward(family_model):
    """``arch.cached_forward`` (the KV cache under this transformers' keyword) on every family: a prefill of 5
    tokens then 4 cached one-token steps give the full forward's logits; and the cache really is used (a step
    without it sees only its own token and differs)."""
    _, model = family_model
    x = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(input_ids=x, use_cache=False).logits
        out, cache = arch.cached_forward(model, x[:, :5])
        steps = [out.logits[:, -1]]
        for t in range(5, 9):
            out, cache = arch.cached_forward(model, x[:, t:t + 1], cache)
            steps.append(out.logits[:, -1])
        alone = model(input_ids=x[:, 8:9], use_cache=False).logits[:, -1]
    got = torch.stack(steps, 1)
    assert (got - full[:, 4:9]).abs().max() < 1e-4
    assert (alone - full[:, 8]).abs().max() > 1e-3
