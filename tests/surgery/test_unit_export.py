"""Sublayer exports reload anywhere: ``prune --unit attention|mlp`` writes a Hugging Face folder whose removed
sublayers' output projections (weight and bias) are zero; stock transformers loads it, and its logits equal swapkl's
skipping model.  The CLI says that stock runtimes still compute a zeroed sublayer, and refuses what cannot carry a
sublayer removal in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf

from conftest import FAMILY_NAMES, tiny_model
from swapkl.surgery.prune import read_prune_record, save_pruned
from swapkl.surgery.removal_set import RemovalSet
from swapkl.surgery.skip import skipping_copy


def _max_diff(a, b, vocab):
    x = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        return float((a(input_ids=x, use_cache=False).logits - b(input_ids=x, use_cache=False).logits).abs().max())


@pytest.mark.parametrize("kind", FAMILY_NAMES)
def test_export_reloads_equal_to_skipping(kind, tmp_path):
    model = tiny_model(kind)
    rs = RemovalSet([(0, "attention"), (2, "mlp"), (3, "block")])
    out = save_pruned(model, rs, tmp_path / "out")
    re = tf.AutoModelForCausalLM.from_pretrained(out).eval()
    assert _max_diff(re, skipping_copy(model, rs), 96) < 1e-5
    assert _max_diff(re, model, 96) > 1e-3
    rec = read_prune_record(out)
    assert rec["removed_units"] == rs.to_list() and rec["num_layers_after"] == 3
    assert "still compute" in rec["runtime_note"]
    sd = re.state_dict()
    for name in rec["zeroed_projections_before_block_removal"]:  # layers 0 and 2 keep their slots (3 is deleted)
        for suffix in ("weight", "bias"):
            if f"{name}.{suffix}" in sd:
                assert not sd[f"{name}.{suffix}"].any()


def test_cli_prune_unit_verify(cli, stories_path, tmp_path):
    rc, out, err = cli("prune", stories_path, "--unit", "attention", "--remove", "1,3", "--out", tmp_path / "p",
                       "--verify")
    assert rc == 0, err
    assert "still compute" in out and "verified" in out
    rec = json.loads((tmp_path / "p" / "swapkl_prune.json").read_text())
    assert rec["removed_units"] == [[1, "attention"], [3, "attention"]] and rec["num_layers_after"] == 5
    base = tf.AutoModelForCausalLM.from_pretrained(stories_path).eval()
    re = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "p").eval()
    assert _max_diff(re, skipping_copy(base, [1, 3], "attention"), base.config.vocab_size) < 1e-5


def test_cli_prune_unit_refusals(cli, stories_path, tmp_path):
    rc, out, err = cli("prune", stories_path, "--unit", "mlp", "--remove", "1", "--format", "mergekit",
                       "--out", tmp_path / "m.yaml")
    assert rc == 2 and "a mergekit YAML cannot zero a sublayer" in err and len(err.strip().splitlines()) == 1
    rc, out, err = cli("prune", stories_path, "--unit", "mlp", "--remove", "9", "--out", tmp_path / "q")
    assert rc == 2 and "out of range" in err
    rc, out, err = cli("prune", stories_path, "--unit", "ffn", "--remove", "1", "--out", tmp_path / "r")
    assert rc == 2 and "invalid choice: 'ffn'" in err and not (tmp_path / "r").exists()


def test_cli_prune_from_unit_files(cli, stories_path, tmp_path):
    """A curves or evidence file of an attention unit exports attention sublayers (its unit carried)."""
    from swapkl.removal.curves import CurvesResult

    e = {"n": 1, "removed": [2], "ppl": 11.0, "ppl_ci": [10.0, 12.0], "delta_pct": 5.0, "delta_pct_ci": [1.0, 9.0],
         "kl_to_base": 0.1}
    cur = CurvesResult(model={"num_layers": 5}, evaluator={"name": "t", "max_words": 1, "window": 8, "stride": 4},
                       corpus={}, budget=1, selection={}, baseline_ppl=10.0, baseline_ppl_ci=[9.0, 11.0], baseline={},
                       methods={"replacement": [e]}, unit="attention")
    f = tmp_path / "cur.json"
    cur.to_json(f)
    rc, out, err = cli("prune", stories_path, "--from", f, "--method", "replacement", "--n", 1, "--out", tmp_path / "o")
    assert rc == 0, err
    assert json.loads((tmp_path / "o" / "swapkl_prune.json").read_text())["removed_units"] == [[2, "attention"]]
    rc, out, err = cli("prune", stories_path, "--from", f, "--method", "replacement", "--n", 1, "--unit", "mlp",
                       "--out", tmp_path / "o2")
    assert rc == 2 and "does not match" in err


@pytest.mark.parametrize("unit,qtype", [("attention", "Q8_0"), ("mlp", "Q4_1")])
def test_gguf_sublayer_export(cli, tmp_path, unit, qtype):
    """A GGUF source: the sublayers' output projections written as zero bytes in their own (quantised) type;
    transformers reads the file with swapkl's skipping model's logits, the other tensors byte for byte."""
    import gguf

    from support.gguf_tiny import write_tiny_llama_gguf
    from swapkl.model.gguf import load_gguf

    src = write_tiny_llama_gguf(tmp_path / "tiny.gguf", n_layers=5, qtype=qtype)
    out = tmp_path / "z.gguf"
    rc, so, se = cli("prune", src, "--unit", unit, "--remove", "1,3", "--format", "gguf", "--out", out, "--verify")
    assert rc == 0, se
    assert "still compute" in so and "verified" in so
    name = {"attention": "attn_output", "mlp": "ffn_down"}[unit]
    a, b = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(out))
    tb = {t.name: t for t in b.tensors}
    for t in a.tensors:
        zeroed = t.name in (f"blk.1.{name}.weight", f"blk.3.{name}.weight")
        assert tb[t.name].tensor_type == t.tensor_type
        assert (not tb[t.name].data.any()) if zeroed else np.array_equal(tb[t.name].data, t.data)
    base, _ = load_gguf(str(src), with_tokenizer=False)
    pruned, _ = load_gguf(str(out), with_tokenizer=False)
    assert _max_diff(pruned, skipping_copy(base, [1, 3], unit), 96) < 1e-5
    assert _max_diff(pruned, base, 96) > 1e-3
