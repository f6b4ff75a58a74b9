"""Removal curves of attention / MLP sublayers on stories260K with hand-built unit score matrices: every point equals
the perplexity of a plain reference model (a deep copy with the chosen sublayers' output projections zeroed), the
guided sets are the block selection rule's on the unit's matrices, BI per sublayer equals a plain computation from
the model's hidden states, and block-only methods are refused for a sublayer unit in one line."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.errors import ContractError
from swapkl.model import architectures as arch
from swapkl.model.units import layout_for
from swapkl.removal.curves import CurvesResult, removal_curves
from swapkl.measure.evaluate import Evaluator, eval_ids, evaluate_ppl
from swapkl.measure.memo import EvalMemo
from swapkl.removal.methods.bi import sublayer_influence
from swapkl.removal.selection import select
from swapkl.surgery.sizes import params_removed, unit_sizes
from swapkl.removal.plan import RemovalPlan, RunHooks
from test_removal import scores5

EV = Evaluator("tiny", 200, 128, 64)


def zeroed_plain(model, layers, unit):
    m = copy.deepcopy(model)
    layout = layout_for(model, arch.locate(model))
    with torch.no_grad():
        for k in layers:
            for path in layout.spec(unit).out:
                mod = arch.get_path(arch.locate(m).blocks[k], path)
                mod.weight.zero_()
                if getattr(mod, "bias", None) is not None:
                    mod.bias.zero_()
    return m


@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_unit_curves_equal_plain_reference(stories_hf, unit):
    model, tok, corpus = stories_hf
    scores = scores5()
    r = removal_curves(model, tok, scores, RemovalPlan(budget=2, methods=["replacement", "interchange", "bi", "sleb"], evaluator=EV, unit=unit, method_params={"sleb": {"calib_tokens": 256}}),
                       RunHooks(corpus=corpus, memo=EvalMemo()))
    assert r.unit == unit
    ids = eval_ids(corpus, tok, EV)
    base = evaluate_ppl(model, ids, EV.window, EV.stride)
    assert r.baseline_ppl == pytest.approx(base.ppl, rel=1e-9)
    for m in ("replacement", "interchange"):
        want = select(np.asarray(scores[m]), 2, spacing=1, candidates=[1, 2, 3], strict=False)
        assert [e["removed"] for e in r.methods[m]] == want
    for m in ("replacement", "bi", "sleb"):
        for e in r.methods[m]:
            ref = evaluate_ppl(zeroed_plain(model, e["removed"], unit), ids, EV.window, EV.stride)
            assert e["ppl"] == pytest.approx(ref.ppl, rel=1e-5)
    # sizes: the unit's parameters, and the two units of a layer make its block
    sz = r.sizes
    assert sz["attention"][0] + sz["mlp"][0] == sz["block"][0]
    blk = arch.locate(model).blocks[0]
    want_att = sum(p.numel() for n, p in blk.named_parameters() if n.startswith(("self_attn.", "input_layernorm.")))
    assert sz["attention"][0] == want_att
    assert params_removed(sz, [1, 3], "mlp") == sz["mlp"][1] + sz["mlp"][3]
    again = CurvesResult.from_dict(r.to_dict())
    assert again.unit == unit and again.sizes == sz


def test_unit_curves_separate_memo_keys(stories_hf):
    model, tok, corpus = stories_hf
    memo = EvalMemo()
    a = removal_curves(model, tok, scores5(), RemovalPlan(budget=1, methods=["replacement"], evaluator=EV, unit="attention"),
                       RunHooks(corpus=corpus, memo=memo))
    b = removal_curves(model, tok, scores5(), RemovalPlan(budget=1, methods=["replacement"], evaluator=EV, unit="block"),
                       RunHooks(corpus=corpus, memo=memo))
    assert a.methods["replacement"][0]["removed"] == b.methods["replacement"][0]["removed"]
    assert a.methods["replacement"][0]["ppl"] != b.methods["replacement"][0]["ppl"]


def test_block_methods_refused_for_units(stories_hf):
    model, tok, corpus = stories_hf
    with pytest.raises(ContractError, match="remove whole blocks only"):
        removal_curves(model, tok, scores5(), RemovalPlan(budget=1, methods=["cka"], evaluator=EV, unit="mlp"),
                       RunHooks(corpus=corpus, memo=EvalMemo()))
    with pytest.raises(ContractError, match="unknown unit"):
        removal_curves(model, tok, scores5(), RemovalPlan(budget=1, methods=["random"], evaluator=EV, unit="ffn"),
                       RunHooks(corpus=corpus, memo=EvalMemo()))


def _plain_sublayer_bi(model, ids, unit):
    """1 - mean cos(r, r + f(r)) per token from hidden states: the attention's output is block k with its MLP
    zeroed applied to the block input; the MLP's is block k itself applied to that."""
    loc = arch.locate(model)
    args, kwargs = arch.block_call_args(model, ids.numel())
    with torch.no_grad():
        hs = model(input_ids=ids[None], output_hidden_states=True, use_cache=False).hidden_states
        out = []
        for k in range(loc.num_layers):
            h = hs[k]
            no_mlp = arch.locate(zeroed_plain(model, [k], "mlp")).blocks[k]
            a = no_mlp(h, *args, **kwargs)
            a = a[0] if isinstance(a, tuple) else a
            if unit == "attention":
                x, y = h, a
            else:
                b = loc.blocks[k](h, *args, **kwargs)
                x, y = a, (b[0] if isinstance(b, tuple) else b)
            out.append(1 - float(torch.nn.functional.cosine_similarity(x, y, dim=-1).double().mean()))
    return np.array(out)


@pytest.mark.parametrize("kind", ["stories", "gpt_neox", "gpt2"])
@pytest.mark.parametrize("unit", ["attention", "mlp"])
def test_sublayer_bi_equals_plain(stories_hf, kind, unit):
    model = stories_hf[0] if kind == "stories" else tiny_model(kind)
    ids = torch.randint(0, 90, (48,), generator=torch.Generator().manual_seed(0))
    got = sublayer_influence(model, ids, unit, window=48, batch_size=1)
    want = _plain_sublayer_bi(model, ids, unit)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.ptp(got) > 0


def test_unit_sizes_tiny_gpt2():
    model = tiny_model("gpt2")
    sz = unit_sizes(model)
    blk = arch.locate(model).blocks[0]
    assert sz["attention"][0] == sum(p.numel() for n, p in blk.named_parameters() if n.startswith(("ln_1.", "attn.")))
    assert sz["non_embedding"] == sum(sz["block"]) + sum(p.numel() for p in model.transformer.ln_f.parameters())
