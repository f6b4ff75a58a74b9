"""The best mix (swapkl/removal/methods/mix.py) on stories260K and a tiny Llama: the greedy's every trial PPL and
choice equal a naive recomputation with deep-copied models whose chosen sublayers' output projections are zeroed,
unit sizes counted from named parameters; the sets for n are the first to reach n blocks' worth of parameters;
the curves runner's held-out points equal the plain evaluator; the guided mix ranks by its own swap-KL per
parameter; calibration text overlapping the held-out text is refused."""
from __future__ import annotations

import copy
import types

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.model.units import layout_for
from swapkl.removal.curves import CurvesResult, removal_curves
from swapkl.measure.evaluate import Evaluator, eval_ids, evaluate_ppl
from swapkl.measure.memo import EvalMemo
from swapkl.removal.methods import MethodContext
from swapkl.removal.methods import mix as MX
from swapkl.removal.selection import layer_scores
from swapkl.removal.plan import RemovalPlan, RunHooks

EV = Evaluator("tiny", 200, 128, 64)
TOKENS = 128
PREFIX = {"attention": ("self_attn.", "input_layernorm."), "mlp": ("mlp.", "post_attention_layernorm.")}


@pytest.fixture(scope="module")
def stories3(stories_path, wikitext_path):
    import transformers as tf

    from swapkl.scoring.corpora import from_file

    torch.set_num_threads(1)
    return (tf.AutoModelForCausalLM.from_pretrained(stories_path).eval(),
            tf.AutoTokenizer.from_pretrained(stories_path), from_file(wikitext_path))


def zeroed(model, units):
    """A deep copy with the output projections of every ``(layer, unit)`` zeroed (the plain form of skipping)."""
    m = copy.deepcopy(model)
    layout = layout_for(model, arch.locate(model))
    with torch.no_grad():
        for layer, unit in units:
            for path in layout.spec(unit).out:
                mod = arch.get_path(arch.locate(m).blocks[layer], path)
                mod.weight.zero_()
                if getattr(mod, "bias", None) is not None:
                    mod.bias.zero_()
    return m


def plain_size(model, layer, unit):
    blk = arch.locate(model).blocks[layer]
    return sum(p.numel() for n, p in blk.named_parameters() if n.startswith(PREFIX[unit]))


def ctx_for(model, tok, corpus, L, params, calib_ids=None):
    ctx = MethodContext(model=model, tokenizer=tok, scores={}, num_layers=L, candidates=list(range(1, L - 1)),
                        spacing=1, partners=None, corpus=corpus, evaluator=EV, seeds=[0], memo=EvalMemo(),
                        params=params)
    if calib_ids is not None:
        ctx._calib_ids = calib_ids
    return ctx


def naive_greedy(model, ids, budget):
    """The greedy recomputed plainly: every trial a zeroed deep copy on the same calibration ids, non-overlapping
    windows; (picks, trial PPLs per step, targets)."""
    L = arch.locate(model).num_layers
    units = [(layer, u) for layer in range(L) for u in ("attention", "mlp")]
    size = {x: plain_size(model, *x) for x in units}
    block = [sum(p.numel() for p in b.parameters()) for b in arch.locate(model).blocks]
    goal = [round(n * sum(block) / L) for n in range(1, budget + 1)]
    win = min(EV.window, ids.numel())
    ppl = lambda s: evaluate_ppl(zeroed(model, s) if s else model, ids, win, win).ppl
    picks, trials, cur, total = [], [], ppl([]), 0
    while total < goal[-1]:
        cand = [x for x in units if x not in picks
                and sum(1 for layer in range(L) if {(layer, "attention"), (layer, "mlp")} <= set(picks + [x])) < L]
        vals = {x: ppl(picks + [x]) for x in cand}
        best = min(cand, key=lambda x: ((vals[x] - cur) / size[x], MX.code(*x)))
        picks.append(best)
        trials.append(vals)
        cur, total = vals[best], total + size[best]
    return picks, trials, goal, size


def check_greedy(model, tok, corpus, budget, calib_ids=None):
    L = arch.locate(model).num_layers
    ctx = ctx_for(model, tok, corpus, L, {"mix": {"calib_tokens": TOKENS}}, calib_ids)
    out = MX.mix_greedy(ctx, budget)
    picks, trials, goal, size = naive_greedy(model, ctx.calib_ids(TOKENS), budget)
    steps = out.info["steps"]
    assert [tuple(s["unit"]) for s in steps] == picks
    for s, want in zip(steps, trials):
        assert set(s["trials"]) == {str(MX.code(*x)) for x in want}
        for x, v in want.items():
            assert s["trials"][str(MX.code(*x))] == pytest.approx(v, rel=1e-5)
    assert out.settings["targets"] == goal
    # the set for n: the first prefix of the picks whose parameters reach n blocks' worth
    for n, info in enumerate(out.info["sets"], start=1):
        cum = np.cumsum([size[x] for x in picks])
        k = int(np.argmax(cum >= goal[n - 1]))
        assert info["params_removed"] == cum[k] >= goal[n - 1] and (k == 0 or cum[k - 1] < goal[n - 1])
        want = MX.decode(MX.code(*x) for x in picks[:k + 1])
        assert info["removal"] == want.to_list()
        assert out.variant["sets"][n - 1] == sorted(MX.code(*x) for x in picks[:k + 1])
        assert out.sets[n - 1] == want.blocks
    return out


def test_greedy_equals_naive_stories(stories3):
    model, tok, corpus = stories3
    check_greedy(model, tok, corpus, 2)


def test_greedy_equals_naive_tiny(wikitext_path):
    from swapkl.scoring.corpora import from_file

    torch.manual_seed(0)
    model = tiny_model("llama", num_layers=4).eval()
    ids = torch.randint(0, model.config.vocab_size, (TOKENS,))
    check_greedy(model, None, from_file(wikitext_path), 1, calib_ids=ids)


def test_mix_curves_equal_plain(stories3):
    model, tok, corpus = stories3
    r = removal_curves(model, tok, None, RemovalPlan(budget=2, methods=["mix"], evaluator=EV, kl=False, method_params={"mix": {"calib_tokens": TOKENS}}),
                       RunHooks(corpus=corpus, memo=EvalMemo()))
    ids = eval_ids(corpus, tok, EV)
    base = evaluate_ppl(model, ids, EV.window, EV.stride).ppl
    sets = r.method_info["mix"]["sets"]
    for e, info in zip(r.methods["mix"], sets):
        units = [tuple(x) for x in info["removal"]]
        plain = [(layer, u) for layer, unit in units for u in (("attention", "mlp") if unit == "block" else (unit,))]
        want = evaluate_ppl(zeroed(model, plain), ids, EV.window, EV.stride).ppl
        assert e["ppl"] == pytest.approx(want, rel=1e-5)
        assert e["delta_pct"] == pytest.approx(100 * (want / base - 1), rel=1e-4, abs=1e-6)
        assert e["removed"] is None and e["params_removed"] == sum(plain_size(model, *x) for x in plain)
        assert e["removal"] == MX.decode(MX.code(*x) for x in plain).label()
    again = CurvesResult.from_dict(r.to_dict())
    assert again.methods["mix"] == r.to_dict()["methods"]["mix"]


def test_guided_mix_order(stories3):
    model, tok, corpus = stories3
    rng = np.random.default_rng(1)
    us = {}
    for u in ("attention", "mlp"):
        d = rng.uniform(0.05, 1.0, (5, 5))
        d = (d + d.T) / 2
        np.fill_diagonal(d, np.nan)
        us[u] = {"replacement": d}
    ctx = ctx_for(model, tok, corpus, 5, {"mix-guided": {"unit_scores": us}})
    out = MX.mix_guided(ctx, 2)
    rate = {(layer, u): float(layer_scores(us[u]["replacement"])[layer]) / plain_size(model, layer, u)
            for layer in range(5) for u in us}
    order = sorted(rate, key=lambda x: (rate[x], MX.code(*x)))
    size = {x: plain_size(model, *x) for x in rate}
    block_mean = sum(sum(p.numel() for p in b.parameters()) for b in arch.locate(model).blocks) / 5
    for n, codes in enumerate(out.variant["sets"], start=1):
        cum = np.cumsum([size[x] for x in order])
        k = int(np.argmax(cum >= round(n * block_mean)))
        assert codes == sorted(MX.code(*x) for x in order[:k + 1])
    with pytest.raises(SwapklError, match="needs the attention unit's interchange"):
        MX.mix_guided(ctx_for(model, tok, corpus, 5, {"mix-guided": {"unit_scores": us, "protocol": "interchange"}}), 1)


def test_calibration_disjoint_from_held_out():
    corpus = types.SimpleNamespace(split_point=300)
    assert MX.check_disjoint(corpus, Evaluator("x", 300, 128, 64), 50) == (300, 350)
    with pytest.raises(SwapklError, match="overlaps the held-out text"):
        MX.check_disjoint(corpus, Evaluator("x", 301, 128, 64), 50)


def test_curves_cli_runs_the_mix(stories_path, wikitext_path, tmp_path, monkeypatch, capsys):
    """``swapkl curves --methods mix``: the JSON's mix points carry the set's label and its parameters (those of the
    method's own record, reaching the target), and the printed curve names the mixed set."""
    import json

    from swapkl.commands.cli import main
    from test_removal import scores5

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    sc = {k: [[None if v != v else float(v) for v in row] for row in m] for k, m in scores5().items()}
    (tmp_path / "s.json").write_text(json.dumps(sc))
    out = tmp_path / "c.json"
    assert main(["curves", str(stories_path), "--device", "cpu", "--budget", "1", "--scores", str(tmp_path / "s.json"),
                 "--methods", "mix", "--eval-text", str(wikitext_path), "--max-words", "400", "--no-kl", "--no-cache",
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    e = d["methods"]["mix"][0]
    info = d["method_info"]["mix"]["sets"][0]
    assert e["removed"] is None and e["removal"] == info["label"] and e["params_removed"] == info["params_removed"]
    assert info["params_removed"] >= d["method_info"]["mix"]["settings"]["targets"][0]
    assert f"n=1   {e['removal']}" in capsys.readouterr().out
