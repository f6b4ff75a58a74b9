"""The validated generic fallback for families not in the table (OPT, OLMo, Phi, ...): found by the usual
module names, accepted only when it reproduces the model's own forward, and then exact in the engine and in
layer removal like the listed families."""
from __future__ import annotations

import pytest
import torch
import transformers as tf

from swapkl.model.architectures import UnsupportedArchitecture, locate
from swapkl.contract import pair_list
from swapkl.scoring.engine import SwapEngine
from swapkl.scoring.reference import reference_sweep
from swapkl.model.tiny import scale_matrices


def _tiny(kind: str, layers: int = 4, **kw):
    torch.manual_seed(0)
    if kind == "opt":
        cfg = tf.OPTConfig(num_hidden_layers=layers, hidden_size=32, num_attention_heads=4, ffn_dim=64,
                           vocab_size=96, word_embed_proj_dim=kw.pop("proj", 32), max_position_embeddings=128,
                           bos_token_id=0, eos_token_id=0, pad_token_id=1, **kw)
    else:
        cfg = tf.AutoConfig.for_model(kind, num_hidden_layers=layers, hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, vocab_size=96,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    scale_matrices(model)
    return model


GENERIC = [("opt", "model.decoder.layers", "model.decoder.final_layer_norm"),
           ("olmo", "model.layers", "model.norm"),
           ("phi", "model.layers", "model.final_layernorm")]


@pytest.mark.parametrize("kind,blocks,norm", GENERIC)
def test_generic_family_is_found_and_exact(kind, blocks, norm):
    model = _tiny(kind)
    loc = locate(model)
    assert loc.family.generic and loc.family.name == f"generic:{kind}"
    assert (loc.family.blocks, loc.family.final_norm) == (blocks, norm)
    ids = torch.randint(2, 96, (3, 10), generator=torch.Generator().manual_seed(1))
    pairs = pair_list("all", 4)
    for positions in ("all", "last"):
        got = SwapEngine(model, ids, positions=positions, max_live=4, max_rows=2).sweep(pairs)
        ref = reference_sweep(model, ids, pairs, positions=positions)
        worst = max((got[p][k].double() - ref[p][k]).abs().max().item() for p in pairs for k in ref[p])
        assert worst < 1e-5
        assert min(ref[p][k].mean().item() for p in pairs for k in ref[p]) > 1e-3


@pytest.mark.parametrize("kind", ["opt", "olmo"])
def test_generic_family_prunes_and_reloads(kind, tmp_path):
    from swapkl.surgery.prune import pruned_copy, save_pruned

    model = _tiny(kind, layers=5)
    ids = torch.randint(2, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    pruned = pruned_copy(model, [1, 3])
    assert len(locate(pruned).blocks) == 3 and len(locate(model).blocks) == 5
    # the pruned model equals the original with blocks 1 and 3 skipped
    def identity(mod, args, kwargs, out):
        h = args[0] if args else kwargs["hidden_states"]
        return (h,) + tuple(out[1:]) if isinstance(out, tuple) else h

    blocks = locate(model).blocks
    hooks = [blocks[k].register_forward_hook(identity, with_kwargs=True) for k in (1, 3)]
    try:
        want = model(input_ids=ids, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()
    got = pruned(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    out = save_pruned(model, [1, 3], tmp_path / "p")
    back = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(back(input_ids=ids, use_cache=False).logits, got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,kw", [("opt", {"proj": 16}), ("gemma2", {"head_dim": 8})])
def test_fallback_takes_the_models_own_tail_when_norm_and_head_do_not_reproduce(kind, kw):
    # OPT with a projection after the final norm, Gemma-2 with its final logit soft-capping: head(final_norm(h)) is
    # not their logits; the model's own forward after its last block is, and the engine is exact with it
    model = _tiny(kind, **kw)
    if kind == "gemma2":
        assert model.config.final_logit_softcapping
    loc = locate(model)
    assert loc.family.output == "tail"
    ids = torch.randint(2, 96, (3, 10), generator=torch.Generator().manual_seed(1))
    pairs = pair_list("all", 4)
    got = SwapEngine(model, ids, max_live=4, max_rows=2).sweep(pairs)
    ref = reference_sweep(model, ids, pairs)
    worst = max((got[p][k].double() - ref[p][k]).abs().max().item() for p in pairs for k in ref[p])
    assert worst < 1e-5
    with torch.no_grad():
        h = torch.randn(2, 5, 32)
        plain = model.lm_head(loc.final_norm(h)) if kind == "gemma2" else None
        if plain is not None:  # the soft-capped logits are bounded by the cap, the plain head's are not
            assert loc.logits(h).abs().max() <= model.config.final_logit_softcapping
            cap = model.config.final_logit_softcapping
            torch.testing.assert_close(loc.logits(h), cap * torch.tanh(plain / cap))


REFUSED = [
    # two stacks of 4 blocks run in cycles, 32 calls in all (the hierarchical reasoning model)
    ("hrm_text", "no list of blocks as long as its layer count (num_hidden_layers = 32; its module lists hold 4, 4)"),
    # a recurrent section (blocks 1 and 2) run twice between the input and the output blocks
    ("dory", "model.layers: the blocks are not each called once per forward, in order (called 0 1 2 1 2 3)"),
    # 32 learned prompt positions in front of the tokens, dropped after the last block
    ("cpmant", "cpmant.encoder.layers: its blocks run over other positions than the input's tokens "
               "(a hidden state of shape [2, 39, 64] for 7 tokens)"),
]


@pytest.mark.parametrize("model_type,why", REFUSED)
def test_fallback_refuses_what_it_cannot_reproduce(model_type, why):
    # refused in one line that says why, never a traceback
    from swapkl.model.tiny import tiny_model

    with pytest.raises(UnsupportedArchitecture) as e:
        locate(tiny_model(model_type))
    message = str(e.value)
    assert message.startswith(f"unsupported architecture: {model_type}; ")
    assert message.endswith(f"(the generic fallback could not validate it: {why})")
    assert "\n" not in message and len(message) <= 300


def test_a_long_refusal_keeps_its_whole_reasons():
    from swapkl.model.discovery import _clipped

    reasons = "a.layers: " + "x" * 40 + "; b.layers: " + "y" * 40 + "; c.layers: " + "z" * 40
    assert _clipped(reasons, len(reasons)) == reasons
    assert _clipped(reasons, 110) == "a.layers: " + "x" * 40 + "; b.layers: " + "y" * 40 + "; ..."
    assert _clipped(reasons, 60) == "a.layers: " + "x" * 40 + "; ..."
    assert _clipped(reasons, 30) == reasons[:30]  # not even the first reason fits


def test_generic_checkpoint_loads_through_the_cli_path(tmp_path):
    from swapkl.model.checkpoints import load_checkpoint

    model = _tiny("olmo")
    model.save_pretrained(tmp_path / "olmo")
    tf.PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer()).save_pretrained(tmp_path / "olmo")
    ck = load_checkpoint(str(tmp_path / "olmo"), device="cpu")
    assert ck.family.name == "generic:olmo" and ck.identity["family"] == "generic:olmo"
    assert ck.identity["num_layers"] == 4


def _word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{k}": k for k in range(96)} | {"[UNK]": 95}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok
