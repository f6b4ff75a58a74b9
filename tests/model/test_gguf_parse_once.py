"""``load_gguf`` parses a GGUF's header once for the config, the weights and the tokenizer, and builds gguf's
tensor-name map once, and gives exactly what transformers' own loader gives (stories260K written as a GGUF with
its real SentencePiece tokenizer)."""
from __future__ import annotations

import gguf as gguf_pkg
import pytest
import torch

from swapkl.model import gguf

from support.gguf_from_hf import write_llama_folder_gguf

TEXT = "Once upon a time, a little girl named Lily found a shiny red ball in the park."


@pytest.fixture(scope="module")
def stories_gguf(stories_path, tmp_path_factory):
    return write_llama_folder_gguf(stories_path, tmp_path_factory.mktemp("gguf") / "stories260K.gguf", qtype="Q8_0")


def _plain(path):
    """transformers' loader as it comes (every call parses the file)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tok


def test_parsed_once_equals_transformers_own_loading(stories_gguf):
    model, tok = gguf.load_gguf(stories_gguf)
    ref, ref_tok = _plain(stories_gguf)
    ours, theirs = model.state_dict(), ref.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]), k
    skip = {"quantization_config", "_name_or_path"}
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in skip}
    assert cfg == {k: v for k, v in ref.config.to_dict().items() if k not in skip}
    assert tok.get_vocab() == ref_tok.get_vocab() and len(tok.get_vocab()) == 512
    assert tok(TEXT)["input_ids"] == ref_tok(TEXT)["input_ids"]
    ids = torch.tensor([tok(TEXT)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, ref(ids, use_cache=False).logits)


def test_the_header_is_parsed_once_and_the_name_map_built_once(stories_gguf, monkeypatch):
    readers, maps = [], []
    real_reader, real_map = gguf_pkg.GGUFReader, gguf_pkg.get_tensor_name_map

    class CountingReader(real_reader):
        def __init__(self, path, *a, **k):
            readers.append(str(path))
            super().__init__(path, *a, **k)

    def counting_map(*a):
        maps.append(a)
        return real_map(*a)

    monkeypatch.setattr(gguf_pkg, "GGUFReader", CountingReader)
    monkeypatch.setattr(gguf_pkg, "get_tensor_name_map", counting_map)
    _plain(stories_gguf)
    plain_readers, plain_maps = len(readers), len(maps)
    assert plain_readers == 3 and plain_maps > 10  # config, weights, tokenizer; a map per module
    readers.clear(), maps.clear()
    gguf.load_gguf(stories_gguf)
    assert readers == [str(stories_gguf)] and len(maps) == len(set(maps)) == 1
    # gguf's own attributes are back after the block
    assert gguf_pkg.GGUFReader is CountingReader and gguf_pkg.get_tensor_name_map is counting_map


def test_the_patch_is_undone_when_loading_fails(tmp_path, stories_gguf):
    real_reader, real_map = gguf_pkg.GGUFReader, gguf_pkg.get_tensor_name_map
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(stories_gguf.read_bytes()[:4096])
    with pytest.raises(gguf.GGUFError, match="cannot convert GGUF file"):
        gguf.load_gguf(cut)
    assert gguf_pkg.GGUFReader is real_reader and gguf_pkg.get_tensor_name_map is real_map
