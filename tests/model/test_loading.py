"""Checkpoint resolution and loading, offline."""
from __future__ import annotations

import pytest
import torch

from swapkl.model.architectures import UnsupportedArchitecture, family_for, locate
from swapkl.model.checkpoints import load_checkpoint, parse_spec
from swapkl.errors import ModelLoadError

GOLDEN = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
          "One day, she saw a big, red ball. She wanted to play with it, but it was too high.")


def test_stories_golden_greedy_continuation(stories_path):
    ck = load_checkpoint(str(stories_path), device="cpu")
    tok = ck.tokenizer
    ids = tok("Once upon a time", return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id
    out = ck.model.generate(ids, max_new_tokens=200, do_sample=False)
    text = tok.decode(out[0], skip_special_tokens=True)
    assert text.startswith(GOLDEN), text[:300]
    assert "Lily's mom said, \"Lily, let's go to the park.\"" in text


def test_identity_is_content_hash(stories_path):
    ck = load_checkpoint(str(stories_path), device="cpu")
    assert ck.identity["kind"] == "local" and len(ck.identity["fingerprint"]) == 64
    assert ck.num_layers == 5 and ck.family.name == "llama"


def test_spec_parsing(tmp_path):
    assert parse_spec("EleutherAI/pythia-410m@step143000") .revision == "step143000"
    assert parse_spec("EleutherAI/pythia-410m", "step0").revision == "step0"
    assert parse_spec("gpt2").kind == "hub"
    assert parse_spec("default").kind == "builtin"
    with pytest.raises(ModelLoadError, match="no such file or folder"):
        parse_spec("/nonexistent/model")
    with pytest.raises(ModelLoadError, match="no such GGUF"):
        parse_spec(str(tmp_path / "x.gguf"))
    with pytest.raises(ModelLoadError, match="no config.json"):
        parse_spec(str(tmp_path))
    with pytest.raises(ModelLoadError, match="--revision applies to Hugging Face hub models"):
        parse_spec("default", "step1000")


def test_unknown_hub_id_offline_is_clear(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="offline"):
        load_checkpoint("swapkl-test/definitely-not-a-model@step7")


def test_unsupported_architecture(tmp_path):

    from swapkl.model.tiny import tiny_model

    # the hierarchical reasoning model runs its block lists in loops: no stack of blocks to swap
    tiny_model("hrm_text").save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitecture, match="unsupported architecture: hrm_text; supported: "):
        load_checkpoint(str(tmp_path))


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt_neox", "gpt2"])
def test_locate_every_family(kind):
    from conftest import tiny_model

    m = tiny_model(kind, num_layers=3)
    loc = locate(m)
    assert loc.num_layers == 3 and loc.family is family_for(kind)
    # final norm + head on the last block's output reproduce the model's logits
    ids = torch.randint(0, 96, (1, 7))
    outs = {}
    h = loc.blocks[-1].register_forward_hook(lambda mod, a, o: outs.setdefault("h", o[0] if isinstance(o, tuple) else o))
    logits = m(input_ids=ids, use_cache=False).logits
    h.remove()
    torch.testing.assert_close(loc.head(loc.final_norm(outs["h"])), logits)
