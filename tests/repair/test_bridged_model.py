"""The bridged model (both forms) against the plain deep-copy implementation, the fit against a plain lstsq on the
same activations, and the folded form's one-line refusals."""
import numpy as np
import pytest
import torch

from support.bridge_plain import near_identity, plain_activations, plain_bridged, plain_kl
from conftest import tiny_model
from swapkl.model import architectures as arch
from swapkl.repair.bridge import Bridge, NoExactFold, bridged_model, spans_of
from swapkl.repair.calibration import CalibrationText, fit_bridges


def _ids(vocab, rows=3, T=12, seed=0):
    return torch.randint(1, vocab, (rows, T), generator=torch.Generator().manual_seed(seed))


def test_spans_of():
    assert spans_of([7, 3, 4]) == [(3, 5), (7, 8)]
    assert spans_of([2]) == [(2, 3)]


@pytest.mark.parametrize("form", ["residual", "folded"])
def test_bridged_model_equals_plain(family_model, form):
    name, model = family_model
    d = model.get_input_embeddings().weight.shape[1]
    spans = [(1, 2), (3, 4)] if form == "folded" else [(0, 1), (2, 4)]  # residual: from block 0 and to the end
    bridges = [Bridge(i, j, form, near_identity(d, i)) for i, j in spans]
    ids = _ids(model.config.vocab_size)
    ours = bridged_model(model, bridges)
    plain = plain_bridged(model, {(b.start, b.end): b.W for b in bridges}, form)
    with torch.inference_mode():
        a = ours(input_ids=ids, use_cache=False).logits
        b = plain(input_ids=ids, use_cache=False).logits
        base = model(input_ids=ids, use_cache=False).logits
    assert (a - b).abs().max() <= 1e-4 * b.abs().max()
    assert (a - base).abs().max() > 1e-2  # the bridge changed something
    assert arch.locate(model).num_layers == 4  # the caller's model is untouched
    assert plain_kl(model, ours, ids).min() > 0


def test_folded_refusals():
    model = tiny_model("llama")
    with pytest.raises(NoExactFold, match="starts at block 0.*residual"):
        bridged_model(model, [Bridge(0, 2, "folded", np.eye(32))])
    from swapkl.model.tiny import tiny_model as tiny_of

    gemma2 = tiny_of("gemma2")  # Gemma's sandwich norm after each MLP output projection: no exact fold
    assert arch.locate(gemma2).family.generic
    with pytest.raises(NoExactFold, match="no MLP output projection whose output is added to the residual") as e:
        bridged_model(gemma2, [Bridge(1, 2, "folded", np.eye(64))])
    assert "\n" not in str(e.value)
    # OPT's fold is found on the model (fc2) and validated: no refusal
    import transformers as tf

    torch.manual_seed(0)
    opt = tf.OPTForCausalLM(tf.OPTConfig(num_hidden_layers=3, hidden_size=32, ffn_dim=64, num_attention_heads=4,
                                         vocab_size=96, word_embed_proj_dim=32, max_position_embeddings=64)).eval()
    assert arch.locate(opt).family.mlp_out == "fc2"
    bridged_model(opt, [Bridge(1, 2, "folded", np.eye(32))])


@pytest.mark.parametrize("form", ["residual", "folded"])
def test_fit_equals_lstsq_on_the_activations(form):
    model = tiny_model("gpt_neox")
    ids = _ids(96, rows=6, T=16, seed=3)
    calib = CalibrationText(ids, [], {"tokens": ids.numel()})
    fits = fit_bridges(model, calib, [(1, 3), (1, 4), (2, 3)], form, ridge=0.0, batch_rows=4, budget_bytes=1)
    for (i, j), br in fits.items():
        act = plain_activations(model, ids, {i, j}, proj=i - 1 if form == "folded" else None)
        if form == "residual":
            x, y = act[i], act[j]
        else:
            x, y = act["m"], act[j] - act[i] + act["m"]
        want = np.linalg.lstsq(x, y, rcond=None)[0]
        np.testing.assert_allclose(br.W, want, rtol=1e-5, atol=1e-6)
        assert br.fit["tokens"] == ids.numel() and 0 <= br.fit["residual"] < 1
