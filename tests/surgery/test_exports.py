"""Exports of a removal set: the mergekit passthrough YAML (0-based, exclusive upper bounds, one slice per kept
run) and the pruned GGUF (quantised blocks copied byte for byte, blocks renumbered, block_count and every
per-layer metadata array trimmed), checked against the HF pruned model.  The GGUF tests use a tiny Llama GGUF
written by tests/support/gguf_tiny.py; the one on the built-in default (98 MB) runs only with SWAPKL_SLOW_TESTS=1."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import builtin_float32
from support.gguf_tiny import write_tiny_llama_gguf

from swapkl.errors import OutputPathError
from swapkl.model.gguf import GGUFError
from swapkl.surgery.exports import ExportError, contract_header, export_mergekit, export_removal
from swapkl.surgery.gguf_prune import llama_quantize_command, prune_gguf
from swapkl.surgery.mergekit import kept_from_config, mergekit_yaml
from swapkl.surgery.removal_set import PruneError, kept_ranges

HAS_MERGEKIT = importlib.util.find_spec("mergekit") is not None
# the cases that trip users (PruneMe #4, mergekit #360): layer 0, the last layer, two adjacent, non-adjacent
CASES = {"first": (12, [0]), "last": (12, [11]), "adjacent": (12, [4, 5]), "non_adjacent": (12, [2, 7]),
         "first_and_last": (6, [0, 5]), "all_but_one": (4, [0, 1, 3]), "mixed": (30, [0, 1, 9, 17, 29])}


def _runs(kept: list[int]) -> int:
    return sum(1 for i, k in enumerate(kept) if i == 0 or kept[i - 1] != k - 1)


# ============================================================================================== mergekit YAML
@pytest.mark.parametrize("case", sorted(CASES))
def test_mergekit_yaml_rebuilds_the_kept_layers(case):
    n, removed = CASES[case]
    text = mergekit_yaml(removed, n, "org/model@abc123", "bfloat16",
                         {"chosen_by": "interchange-guided, n=2", "measured_on": "WikiText-2 16x64"})
    cfg = yaml.safe_load(text)
    expected = [i for i in range(n) if i not in removed]
    assert kept_from_config(cfg) == expected
    assert cfg["merge_method"] == "passthrough" and cfg["dtype"] == "bfloat16"
    ranges = [tuple(s["sources"][0]["layer_range"]) for s in cfg["slices"]]
    assert ranges == kept_ranges(removed, n)
    assert len(ranges) == _runs(expected)                     # one slice per contiguous kept run
    assert all(0 <= a < b <= n for a, b in ranges)            # 0-based, exclusive upper bound
    assert all(s["sources"][0]["model"] == "org/model@abc123" for s in cfg["slices"])
    comments = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert f"# removed layers (0-based, of {n}): {sorted(removed)}" in comments
    assert "# chosen by: interchange-guided, n=2" in comments and "# measured on: WikiText-2 16x64" in comments


def test_mergekit_specific_ranges():
    cfg = yaml.safe_load(mergekit_yaml([0], 12, "m"))
    assert [s["sources"][0]["layer_range"] for s in cfg["slices"]] == [[1, 12]]
    cfg = yaml.safe_load(mergekit_yaml([11], 12, "m"))
    assert [s["sources"][0]["layer_range"] for s in cfg["slices"]] == [[0, 11]]
    cfg = yaml.safe_load(mergekit_yaml([4, 5], 12, "m"))
    assert [s["sources"][0]["layer_range"] for s in cfg["slices"]] == [[0, 4], [6, 12]]
    cfg = yaml.safe_load(mergekit_yaml([2, 7], 12, "m"))
    assert [s["sources"][0]["layer_range"] for s in cfg["slices"]] == [[0, 2], [3, 7], [8, 12]]


def test_mergekit_header_cannot_inject_yaml():
    hostile = "evil\nmerge_method: linear\nslices: []"
    text = mergekit_yaml([1], 4, "m", contract={"model": hostile, "chosen_by": "a\nb: c"})
    cfg = yaml.safe_load(text)
    assert cfg["merge_method"] == "passthrough" and kept_from_config(cfg) == [0, 2, 3]
    # a hostile *source path* is quoted by the YAML writer, not spliced
    cfg = yaml.safe_load(mergekit_yaml([1], 4, "x: y\n- z"))
    assert cfg["slices"][0]["sources"][0]["model"] == "x: y\n- z"


@pytest.mark.parametrize("removed,pattern", [([12], "out of range"), ([-1], "out of range"),
                                              (list(range(12)), "cannot remove all"), (["a"], "integers")])
def test_mergekit_impossible_sets(removed, pattern):
    with pytest.raises(PruneError, match=pattern):
        mergekit_yaml(removed, 12, "m")


def test_export_mergekit_file_rules(tmp_path):
    out = tmp_path / "cut.yaml"
    rep = export_mergekit([2, 3], 6, "org/m", out, contract={"chosen_by": "bi"})
    assert rep["kept"] == [0, 1, 4, 5] and rep["slices"] == 2 and out.is_file()
    before = out.read_text()
    with pytest.raises(OutputPathError, match="exists"):
        export_mergekit([1], 6, "org/m", out)
    assert out.read_text() == before                      # nothing overwritten
    export_mergekit([1], 6, "org/m", out, force=True)
    assert kept_from_config(yaml.safe_load(out.read_text())) == [0, 2, 3, 4, 5]
    with pytest.raises(OutputPathError, match="ending in .yaml"):
        export_mergekit([1], 6, "org/m", tmp_path / "cut.txt")
    src = tmp_path / "model"
    src.mkdir()
    with pytest.raises(OutputPathError, match="inside the source model folder"):
        export_mergekit([1], 6, str(src), src / "cut.yaml", inputs=[src])


@pytest.mark.skipif(not HAS_MERGEKIT, reason="mergekit not installed (requirements-dev.txt)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_mergekit_own_config_loader_accepts(case):
    from mergekit.config import MergeConfiguration

    n, removed = CASES[case]
    mc = MergeConfiguration.model_validate(yaml.safe_load(mergekit_yaml(removed, n, "org/model@abc123")))
    assert mc.merge_method == "passthrough"
    got = [i for s in mc.slices for i in range(*s.sources[0].layer_range)]
    assert got == [i for i in range(n) if i not in removed]
    assert {str(s.sources[0].model.model.path) for s in mc.slices} == {"org/model"}
    assert {s.sources[0].model.model.revision for s in mc.slices} == {"abc123"}


@pytest.mark.skipif(not HAS_MERGEKIT, reason="mergekit not installed (requirements-dev.txt)")
def test_mergekit_passthrough_merge_equals_pruned_copy(stories_path, tmp_path):
    """mergekit's own merge of the YAML gives the model swapkl's pruned_copy gives (stories260K, 5 layers)."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge
    from transformers import AutoModelForCausalLM

    from swapkl.surgery.blocks import pruned_copy

    base = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32).eval()
    x = torch.randint(0, base.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    for removed in ([0], [4], [1, 2], [0, 3]):
        out = tmp_path / f"merged-{'-'.join(map(str, removed))}"
        cfg = yaml.safe_load(mergekit_yaml(removed, 5, str(stories_path)))
        run_merge(MergeConfiguration.model_validate(cfg), str(out),
                  options=MergeOptions(copy_tokenizer=False, lazy_unpickle=False, cuda=False))
        merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        assert merged.config.num_hidden_layers == 5 - len(removed)
        with torch.no_grad():
            a = pruned_copy(base, removed)(input_ids=x, use_cache=False).logits
            b = merged(input_ids=x, use_cache=False).logits
        assert torch.equal(a, b), (removed, float((a - b).abs().max()))


def test_export_removal_mergekit_from_a_loaded_model(stories_path, tmp_path):
    from swapkl.model.checkpoints import load_checkpoint

    ck = load_checkpoint(str(stories_path), device="cpu")
    rep = export_removal(ck.model, [0, 4], tmp_path / "s.yaml", "mergekit", identity=ck.identity,
                         provenance={"chosen_by": "bi, n=2", "measured_on": "canonical contract"})
    text = Path(rep["path"]).read_text()
    assert rep["kept"] == [1, 2, 3] and kept_from_config(yaml.safe_load(text)) == [1, 2, 3]
    cfg = yaml.safe_load(text)
    assert {s["sources"][0]["model"] for s in cfg["slices"]} == {str(stories_path.resolve())}  # the folder as is
    assert "# chosen by: bi, n=2" in text and "fingerprint" not in text
    assert "sha256 " in text                                                 # the folder's fingerprint pins it
    with pytest.raises(ExportError, match="needs a GGUF source"):
        export_removal(ck.model, [1], tmp_path / "s.gguf", "gguf", identity=ck.identity)
    with pytest.raises(ExportError, match="only as a Hugging Face folder"):
        export_removal(ck.model, [1], tmp_path / "m.yaml", "mergekit", identity=ck.identity,
                       merge={"groups": [[1, 2]], "mode": "average"})
    with pytest.raises(ExportError, match="unknown export format"):
        export_removal(ck.model, [1], tmp_path / "m.x", "onnx", identity=ck.identity)
    with pytest.raises(PruneError, match="out of range"):
        export_removal(ck.model, [7], tmp_path / "t.yaml", "mergekit", identity=ck.identity)
    assert not (tmp_path / "t.yaml").exists()


def test_contract_header_of_a_hub_model_pins_the_commit():
    head = contract_header({"kind": "hub", "id": "org/m", "revision": "main", "commit": "c0ffee", "display": "org/m"},
                           {"chosen_by": "recommend, n=3"})
    assert head == {"model": "org/m", "revision": "c0ffee", "chosen_by": "recommend, n=3"}


# ============================================================================================== pruned GGUF
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", n_layers=5)


def _load_gguf(path: Path):
    """transformers' GGUF loader on ``path`` (through ``load_gguf``, which parses the header once instead of twice:
    the default's is ~4 s a parse; tests/model/test_gguf_parse_once.py checks it gives transformers' own result)."""
    from swapkl.model.gguf import load_gguf

    return load_gguf(path, with_tokenizer=False)[0]


def _fields(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    return r, {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.mark.parametrize("removed", [[0], [4], [1, 2], [0, 3]])
def test_pruned_gguf_loads_with_the_hf_pruned_logits(tiny_gguf, tmp_path, removed):
    from swapkl.surgery.blocks import pruned_copy

    out = tmp_path / "pruned.gguf"
    rep = prune_gguf(tiny_gguf, removed, out)
    kept = [i for i in range(5) if i not in removed]
    assert rep["kept"] == kept and rep["num_layers_after"] == len(kept)
    reread = _load_gguf(out)                                   # transformers' GGUF loader reads it back
    assert reread.config.num_hidden_layers == len(kept)
    ref = pruned_copy(_load_gguf(tiny_gguf), removed)          # the HF pruned model built from the same GGUF
    x = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = ref(input_ids=x, use_cache=False).logits
        b = reread(input_ids=x, use_cache=False).logits
    diff = float((a - b).abs().max())
    print(f"tiny GGUF minus {removed}: max |Δlogit| = {diff:.3g}")
    assert diff <= 1e-5


def test_pruned_gguf_copies_blocks_byte_for_byte_and_trims_metadata(tiny_gguf, tmp_path):
    out = tmp_path / "pruned.gguf"
    rep = prune_gguf(tiny_gguf, [1, 3], out)
    src_r, src = _fields(tiny_gguf)
    dst_r, dst = _fields(out)
    assert dst["llama.block_count"] == 3
    assert dst["llama.attention.sliding_window_pattern"] == [True, True, True]  # old blocks 0, 2, 4
    assert rep["trimmed_keys"] == ["llama.attention.sliding_window_pattern"]
    assert dst["swapkl.removed_layers"] == [1, 3]
    for k, v in src.items():                                   # every other key kept, tokenizer included
        if k not in ("llama.block_count", "llama.attention.sliding_window_pattern"):
            assert dst[k] == v, k
    src_t = {t.name: t for t in src_r.tensors}
    dst_t = {t.name: t for t in dst_r.tensors}
    old_of = {0: 0, 1: 2, 2: 4}
    assert len(dst_t) == len(src_t) - 2 * 9
    for name, t in dst_t.items():
        old = name if not name.startswith("blk.") else f"blk.{old_of[int(name.split('.')[1])]}." + name.split(".", 2)[2]
        s = src_t[old]
        assert t.tensor_type == s.tensor_type and t.tensor_type.name in ("Q8_0", "F32")
        assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(s.data).view(np.uint8)), name


def test_pruned_gguf_hostile(tiny_gguf, tmp_path):
    out = tmp_path / "p.gguf"
    with pytest.raises(PruneError, match="out of range"):
        prune_gguf(tiny_gguf, [5], out)
    with pytest.raises(PruneError, match="cannot remove all"):
        prune_gguf(tiny_gguf, range(5), out)
    with pytest.raises(OutputPathError, match="would overwrite the input"):
        prune_gguf(tiny_gguf, [1], tiny_gguf, force=True)
    with pytest.raises(OutputPathError, match="ending in .gguf"):
        prune_gguf(tiny_gguf, [1], tmp_path / "p.bin")
    prune_gguf(tiny_gguf, [1], out)
    with pytest.raises(OutputPathError, match="exists"):
        prune_gguf(tiny_gguf, [2], out)
    assert _fields(out)[1]["swapkl.removed_layers"] == [1]
    prune_gguf(tiny_gguf, [2], out, force=True)
    assert _fields(out)[1]["swapkl.removed_layers"] == [2]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]   # no temporary file left
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf" * 20)
    with pytest.raises(GGUFError, match="not a GGUF file"):
        prune_gguf(junk, [1], tmp_path / "q.gguf")
    assert not (tmp_path / "q.gguf").exists()


def test_pruned_gguf_layer_index_metadata(tmp_path):
    import gguf

    u32 = gguf.GGUFValueType.UINT32
    src = write_tiny_llama_gguf(tmp_path / "dense3.gguf", extra_kv={"llama.leading_dense_block_count": (3, u32)})
    prune_gguf(src, [0, 4], tmp_path / "d.gguf")
    assert _fields(tmp_path / "d.gguf")[1]["llama.leading_dense_block_count"] == 2   # block 0 was one of the 3
    for key in ("llama.nextn_predict_layers", "llama.full_attention_interval"):
        bad = write_tiny_llama_gguf(tmp_path / "bad.gguf", extra_kv={key: (1, u32)})
        with pytest.raises(GGUFError, match=f"sets {key}; removing blocks would change what it means"):
            prune_gguf(bad, [1], tmp_path / "x.gguf")
    bad = write_tiny_llama_gguf(tmp_path / "pl.gguf", extra_tensors={"per_layer_model_proj.weight": np.ones((5, 4))})
    with pytest.raises(GGUFError, match="global per-layer tensor per_layer_model_proj.weight"):
        prune_gguf(bad, [1], tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_llama_quantize_command():
    cmd = llama_quantize_command("/m/My Model.gguf", [7, 3, 3], "/o/out.gguf")
    assert cmd == "llama-quantize --prune-layers 3,7 '/m/My Model.gguf' /o/out.gguf COPY"


@pytest.mark.slow(reason="reads the 98 MB default GGUF")
def test_pruned_default_gguf_round_trip(tmp_path):
    """The built-in SmolLM2-135M-Instruct Q4_1 GGUF minus layers 3 and 17, read back by transformers."""
    from swapkl.model.builtin import default_gguf_path
    from swapkl.surgery.blocks import pruned_copy

    src = default_gguf_path()
    out = tmp_path / "smollm2-minus-3-17.gguf"
    rep = prune_gguf(src, [3, 17], out)
    assert rep["num_layers_after"] == 28
    x = torch.randint(0, 49152, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        b = _load_gguf(out)(input_ids=x, use_cache=False).logits
        a = pruned_copy(builtin_float32(), [3, 17])(input_ids=x, use_cache=False).logits  # the source, dequantised
    diff = float((a - b).abs().max())
    print(f"default GGUF minus [3, 17]: max |Δlogit| = {diff:.3g}, {out.stat().st_size / 1e6:.1f} MB")
    assert diff <= 1e-4
