"""The folded bridged export of stories260K, written as a GGUF the way llama.cpp's converter writes one
(tests/gguf_from_hf.py), runs in llama.cpp like swapkl's bridged model: max |Δlogit| within the llama.cpp test's F32
tolerance (3e-5 of the largest logit, tests/surgery/test_gguf_llamacpp.py), far from the same cut without a bridge, and
llama.cpp's greedy tokens are the bridged model's."""
import shutil

import numpy as np
import pytest

from support.gguf_from_hf import write_llama_folder_gguf
from support.llamacpp_util import INSTALL_HINT, hf_greedy, hf_logits, llamacpp_greedy, llamacpp_logits, load_llamacpp
from swapkl.repair.bridge import bridged_model
from swapkl.repair.calibration import CalibrationText, fit_bridges
from swapkl.repair.export import save_bridged
from swapkl.surgery.blocks import pruned_copy

RTOL_F32 = 3e-5
STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day"


def test_llamacpp_runs_the_bridged_export(stories, stories_path, tmp_path):
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.fail(INSTALL_HINT)
    model, tok = stories.model, stories.tokenizer
    calib = CalibrationText(tok([STORY] * 2, return_tensors="pt")["input_ids"], [], {})
    bridge = fit_bridges(model, calib, [(2, 4)], "folded", ridge=1e-3)[(2, 4)]
    folder = save_bridged(model, [bridge], tmp_path / "bridged", tokenizer=tok)
    if not (folder / "tokenizer.model").exists():  # the converter reads the SentencePiece model
        shutil.copy(stories_path / "tokenizer.model", folder / "tokenizer.model")
    path = write_llama_folder_gguf(folder, tmp_path / "bridged.gguf", qtype="F32")
    llm = load_llamacpp(path)
    assert llm.metadata["llama.block_count"] == "3"
    ids = tok(STORY).input_ids
    bridged = bridged_model(model, [bridge])
    ref = hf_logits(bridged, ids)
    tol = RTOL_F32 * float(np.abs(ref).max())
    cpp = llamacpp_logits(llm, ids)
    assert float(np.abs(cpp - ref).max()) <= tol
    assert float(np.abs(cpp - hf_logits(pruned_copy(model, [2, 3]), ids)).max()) > 10 * tol  # the bridge is in it
    tokens, _ = llamacpp_greedy(llm, ids, 12)
    own, _ = hf_greedy(bridged, ids, 12)
    assert tokens == own
