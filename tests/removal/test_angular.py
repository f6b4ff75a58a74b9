"""Angular distance (swapkl.removal.methods.angular) against a hand computation from output_hidden_states."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.removal import methods as M
from swapkl.measure.evaluate import Evaluator
from swapkl.measure.memo import EvalMemo
from swapkl.removal.methods.angular import best_blocks, residual_stats


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_residual_stats_by_hand(kind):
    model = tiny_model(kind, num_layers=4)
    rows = torch.randint(1, 96, (3, 20), generator=torch.Generator().manual_seed(0))
    from swapkl.model import architectures as arch

    blocks = arch.locate(model).blocks
    st = residual_stats(model, rows, batch_size=2)
    assert all(len(b._forward_hooks) == 0 and len(b._forward_pre_hooks) == 0 for b in blocks)  # none left behind
    with torch.no_grad():
        hs = model(input_ids=rows, output_hidden_states=True, use_cache=False).hidden_states
    # token 0 is the pad id (a zero embedding, angle undefined), so it is not drawn; hidden_states[k] (k < L) is the residual stream entering block k; the last one has the final norm applied,
    # so x_L is checked separately below
    for u in range(3):
        for a in range(4):
            for b in range(4):
                tok = []
                for t in range(20):
                    x, y = hs[a][u, t].double().numpy(), hs[b][u, t].double().numpy()
                    c = float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))
                    tok.append(math.acos(max(-1.0, min(1.0, c))) / math.pi)
                assert st["angular"][u, a, b] == pytest.approx(0.0 if a == b else np.mean(tok), abs=1e-6)
    # x_L: the last block's output (before the final norm) from a forward hook
    out = {}
    h = blocks[3].register_forward_hook(lambda m, a, o: out.setdefault("x", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        model(input_ids=rows, use_cache=False)
    h.remove()
    c = torch.nn.functional.cosine_similarity(hs[3].double(), out["x"].double(), dim=-1)
    np.testing.assert_allclose(st["angular"][:, 3, 4], (torch.arccos(c.clamp(-1, 1)) / math.pi).mean(-1).numpy(),
                               atol=1e-6)
    np.testing.assert_allclose(st["cos_adjacent"][:, 3], c.mean(-1).numpy(), atol=1e-6)


def test_best_blocks_rule():
    d = np.full((6, 6), 0.9)
    d[2, 3] = 0.1   # n=1: layer 2
    d[3, 5] = 0.2   # n=2: layers 3, 4
    d[0, 3] = 0.05  # n=3: layers 0, 1, 2
    assert best_blocks(d, 3) == [[2], [3, 4], [0, 1, 2]]


def test_angular_method_runs_on_calibration_text(stories_path, wikitext_path):
    import transformers as tf

    from swapkl.scoring.corpora import from_file

    model = tf.AutoModelForCausalLM.from_pretrained(stories_path).eval()
    tok = tf.AutoTokenizer.from_pretrained(stories_path)
    corpus = from_file(wikitext_path)
    ctx = M.MethodContext(model=model, tokenizer=tok, scores={}, num_layers=5, candidates=[1, 2, 3], spacing=1,
                          partners=None, corpus=corpus, evaluator=Evaluator("tiny", 200, 128, 64), seeds=[],
                          memo=EvalMemo(), params={"angular": {"calib_tokens": 512}})
    assert M.get("angular").name == "angular"
    out = M.get("angular").func(ctx, 3)
    d = np.asarray(out.info["angular"])
    assert out.sets == best_blocks(d, 3) and [len(s) for s in out.sets] == [1, 2, 3]
    assert out.info["layer_scores"] == pytest.approx([d[k, k + 1] for k in range(5)])
    rows = torch.stack([ctx.calib_ids(512)[s:s + 128] for s in range(0, 512, 128)])
    assert np.allclose(residual_stats(model, rows)["angular"].mean(0), d)
