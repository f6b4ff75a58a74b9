"""``swapkl prune SRC.gguf --remove … --repair bridge --format gguf``: the folded bridged model as a GGUF that
llama.cpp runs (docs/repair.md "Export").

On stories260K written as a GGUF (tests/support/gguf_from_hf.py) in F32 and in Q8_0:

* the written file holds exactly the source's tensors minus the removed blocks, renumbered, byte for byte, except
  block i−1's ``ffn_down`` (weight), which holds the folded projection computed here from the library's fit
  (``folded_weights``), in F32;
* transformers reads it with swapkl's bridged model's logits (``--verify``), and the provenance lies beside it;
* llama.cpp runs it within the pruned-GGUF test's tolerance of the bridged model (every position, the whole
  vocabulary) and generates its greedy tokens, and its logits are far (over ten tolerances) from the raw cut's, so
  a file without the bridge cannot pass;
* a source that is not a GGUF, and a span from block 0 (no MLP before it to fold into), are refused in one line
  with nothing written.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from support.gguf_from_hf import write_llama_folder_gguf
from support.llamacpp_util import INSTALL_HINT, hf_logits, llamacpp_logits, load_llamacpp

from test_gguf_llamacpp import RTOL, STORY, _check_greedy

CALIB = ("--calib-tokens", "512", "--calib-window", "64")
EVAL = ("--evaluator", "matched", "--max-words", "300")
REMOVE = [2, 3]


@pytest.fixture(scope="module")
def sources(tmp_path_factory, stories_path) -> dict:
    d = tmp_path_factory.mktemp("bridge-gguf")
    return {q: write_llama_folder_gguf(stories_path, d / f"stories260K-{q}.gguf", qtype=q) for q in ("F32", "Q8_0")}


def _library_bridges(src, remove):
    """The bridges the command fits, computed here with the library's own calls (same contract and settings)."""
    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.repair.bridge import spans_of
    from swapkl.repair.calibration import calibration_text, fit_bridges
    from swapkl.scoring.corpora import load_corpus
    from swapkl.scoring.prompts import make_prompts

    ck = load_checkpoint(str(src), device="cpu")
    corpus, c = load_corpus(), Contract()
    prompts = make_prompts(ck.tokenizer, corpus, c.prompts, c.tokens, c.seed, c.bos)
    calib = calibration_text(ck.tokenizer, corpus, prompts.description, c.tokens, 512, 64, 0)
    spans = spans_of(remove)
    fits = fit_bridges(ck.model, calib, spans, "folded")
    return ck, [fits[s] for s in spans]


def _tensors(path) -> dict:
    import gguf

    return {t.name: (int(t.tensor_type), np.array(t.data)) for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_bridged_gguf_runs_in_llamacpp_as_the_bridged_model(cli, sources, tmp_path, qtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swapkl.repair.bridge import bridged_model, fold_target, folded_weights
    from swapkl.repair.export import gguf_provenance_path
    from swapkl.surgery.blocks import pruned_copy
    from swapkl.surgery.gguf_prune import prune_gguf

    src, out = sources[qtype], tmp_path / "bridged.gguf"
    rc, text, err = cli("prune", src, "--remove", ",".join(map(str, REMOVE)), "--repair", "bridge",
                        "--format", "gguf", "--out", out, "--verify", *CALIB, *EVAL)
    assert rc == 0, err
    assert "verified: transformers reads the GGUF with swapkl's bridged model's logits" in text, text
    prov = json.loads(gguf_provenance_path(out).read_text())
    assert prov["removed"] == REMOVE and prov["replaced_tensors"] == ["blk.1.ffn_down.weight"]
    assert prov["bridges"][0]["span"] == [2, 4] and prov["bridges"][0]["tokens"] >= 512
    assert set(prov["heldout"]) >= {"delta_ppl_pct_raw", "delta_ppl_pct_bridged"}

    # every tensor as the raw cut writes it, but the folded projection: the library's fold, in F32
    ck, bridges = _library_bridges(src, REMOVE)
    raw = prune_gguf(src, REMOVE, tmp_path / "raw.gguf")["path"]
    got, cut = _tensors(out), _tensors(raw)
    assert got.keys() == cut.keys()
    for name, (typ, data) in cut.items():
        if name != "blk.1.ffn_down.weight":
            assert got[name][0] == typ and np.array_equal(got[name][1], data), name
    want = folded_weights(fold_target(ck.model, 2), "linear", bridges[0].W)["weight"].numpy()
    assert got["blk.1.ffn_down.weight"][0] == 0  # F32
    np.testing.assert_array_equal(got["blk.1.ffn_down.weight"][1], want)

    # llama.cpp runs the bridged model, not the raw cut
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.fail(INSTALL_HINT)
    ids = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)(STORY).input_ids
    bridged = bridged_model(ck.model, bridges).eval()
    ref = hf_logits(bridged, ids)
    tol = RTOL[qtype] * float(np.abs(ref).max())
    llm = load_llamacpp(out)
    diff = float(np.abs(llamacpp_logits(llm, ids) - ref).max())
    far = float(np.abs(hf_logits(pruned_copy(ck.model, REMOVE).eval(), ids) - ref).max())
    print(f"stories {qtype} bridged GGUF: llama.cpp vs swapkl's bridged model {diff:.3g} (tolerance {tol:.3g}); "
          f"raw cut vs bridged {far:.3g}")
    assert diff <= tol
    assert far > 10 * tol
    reread = AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name, dtype=torch.float32).eval()
    _check_greedy(llm, reread, ids, tol, f"stories {qtype} bridged")


def test_bridged_gguf_refusals(cli, sources, stories_path, tmp_path):
    out = tmp_path / "x.gguf"
    rc, _, err = cli("prune", stories_path, "--remove", "2", "--repair", "bridge", "--format", "gguf", "--out", out,
                     *CALIB, *EVAL)
    assert rc == 2 and err.strip().startswith("error: --format gguf needs a GGUF source"), err
    assert len(err.strip().splitlines()) == 1
    rc, _, err = cli("prune", sources["F32"], "--remove", "0,1", "--repair", "bridge", "--format", "gguf",
                     "--out", out, *CALIB, *EVAL)
    assert rc == 2 and "block 0" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob("x.gguf*"))


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_a_quantised_tensor_is_replaced_by_f32_of_its_shape(tmp_path, qtype):
    """The default's ``ffn_down`` is Q4_1: its replacement is written in F32 with the logical shape (not the
    quantised bytes' shape), and transformers reads exactly the replacement; a wrong shape, a tensor of a removed
    block and one outside the blocks are refused."""
    from transformers import AutoModelForCausalLM

    from support.gguf_tiny import FFN, HIDDEN, write_tiny_llama_gguf
    from swapkl.model.gguf import GGUFError
    from swapkl.surgery.gguf_prune import prune_gguf

    src = write_tiny_llama_gguf(tmp_path / "tiny.gguf", qtype=qtype)
    new = np.random.default_rng(1).standard_normal((HIDDEN, FFN)).astype(np.float32)
    rep = prune_gguf(src, [2], tmp_path / "out.gguf", replace={"blk.1.ffn_down.weight": new})
    assert rep["replaced"] == ["blk.1.ffn_down.weight"]
    typ, data = _tensors(rep["path"])["blk.1.ffn_down.weight"]
    assert typ == 0 and np.array_equal(data, new)
    assert _tensors(rep["path"])["blk.2.ffn_down.weight"][0] == _tensors(src)["blk.3.ffn_down.weight"][0] != 0
    m = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="out.gguf", dtype=torch.float32)
    assert torch.equal(m.model.layers[1].mlp.down_proj.weight, torch.from_numpy(new))
    for bad, msg in (({"blk.1.ffn_down.weight": new.T}, "shape"), ({"blk.2.ffn_down.weight": new}, "removed block"),
                     ({"output_norm.weight": new}, "outside the blocks"), ({"blk.9.nope": new}, "no tensor")):
        with pytest.raises(GGUFError, match=msg):
            prune_gguf(src, [2], tmp_path / "bad.gguf", replace=bad)
        assert not (tmp_path / "bad.gguf").exists()
