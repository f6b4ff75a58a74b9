"""Healed curves with a held-out text and with ``--repair bridge`` (swapkl.healing.multi / curves): every point's
held-out perplexities equal a plain evaluation of the same model on that text, and each point carries the raw,
bridged and healed ΔPPL (the bridged one equal to a plain evaluation of the bridged model).  stories260K, 2 steps."""
from __future__ import annotations

import numpy as np
import pytest

from swapkl.healing import train as TR
from swapkl.healing.curves import HealCurves, points
from swapkl.healing.heal import HealSetup, heldout_ids
from swapkl.healing.multi import heal_curves
from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator, eval_ids, evaluate_ppl
from swapkl.removal.plan import RemovalPlan
from swapkl.repair.bridge import bridged_model
from swapkl.scoring.corpora import from_file, from_text
from swapkl.surgery.blocks import pruned_copy

EV = Evaluator("tiny", 300, 128, 64)
TINY = Recipe(steps=2, rank=2, seq_len=32, batch=2, lr=3e-3, warmup=1)
HELDOUT = "tests/fixtures/data/heldout/american-speeches.txt"


def _scores(L=5):
    """Interchange prefers layer 2, replacement layer 1: two different sets at n = 1."""
    def one(low):
        d = np.full((L, L), 1.0)
        np.fill_diagonal(d, np.nan)
        d[low, low + 1] = d[low + 1, low] = 0.05
        return d
    return {"interchange": one(2), "replacement": one(1)}


@pytest.fixture(scope="module")
def run(stories, wikitext_path):
    corpus = from_text(" ".join(from_file(wikitext_path).words[:12_000]), name="wiki12k", label="wiki 12k")
    setup = HealSetup(corpus=corpus, use_cache=False, identity=stories.identity, heldout=from_file(HELDOUT))
    shared, seen = {}, []
    from swapkl.removal.plan import RunHooks

    hc = heal_curves(stories.model, stories.tokenizer, _scores(), RemovalPlan(2, ("interchange", "replacement"),
                     spacing=0, evaluator=EV, repair="bridge", bridge={"calib_tokens": 512, "calib_window": 64}), [1], TINY, setup, RunHooks(progress=lambda d, t, m: seen.append((d, t))),
                     shared=shared)
    return hc, shared, corpus, setup, seen


def _plain(model, ids):
    return evaluate_ppl(model, ids, EV.window, EV.stride, EV.drop_first_target).ppl


def test_held_out_points_equal_a_plain_evaluation(stories, run):
    hc, shared, corpus, setup, seen = run
    ids = heldout_ids(setup.heldout, stories.tokenizer, EV)
    assert seen[-1][0] == seen[-1][1] == 2 * (2 * TINY.steps + 5 * 2)  # two sets; 5 evaluations on 2 texts each
    for m in ("interchange", "replacement"):
        (e,) = hc.methods[m]
        rem = e["removed"]
        h = e["held_out"]
        assert h["label"] == setup.heldout.label
        assert h["ppl"]["pruned"] == pytest.approx(_plain(pruned_copy(stories.model, rem), ids), rel=1e-9)
        assert h["ppl"]["base"] == pytest.approx(_plain(stories.model, ids), rel=1e-9)
        hb = shared["bridges"][tuple(rem)]
        key = next(k for k in shared["adapters"] if k[1] == tuple(rem))
        healed = TR.healed_model(stories.model, rem, TINY, shared["adapters"][key][0], bridges=hb.bridges)
        assert h["ppl"]["healed"] == pytest.approx(_plain(healed, ids), rel=1e-9)
        assert h["healed"]["ppl"] == h["ppl"]["healed"] and h["raw"]["ppl"] == h["ppl"]["pruned"]
        assert h["bridged"]["ppl"] == pytest.approx(_plain(bridged_model(stories.model, list(hb.bridges)), ids),
                                                    rel=1e-9)
        d = h["delta_pct"]["healed_vs_pruned"]
        assert d["ci"][0] <= d["value"] <= d["ci"][1]


def test_each_point_has_raw_bridged_and_healed(stories, run):
    hc, shared, corpus, setup, _ = run
    ids = eval_ids(corpus, stories.tokenizer, EV)
    assert hc.contract["repair"]["settings"]["calib_tokens"] == 512
    for m in ("interchange", "replacement"):
        (e,) = hc.methods[m]
        hb = shared["bridges"][tuple(e["removed"])]
        assert e["bridged"]["ppl"] == pytest.approx(_plain(bridged_model(stories.model, list(hb.bridges)), ids),
                                                    rel=1e-9)
        assert e["raw"]["ppl"] == e["ppl"]["pruned"] and e["healed"]["ppl"] == e["ppl"]["healed"]
        assert e["raw"]["delta_pct"] == e["delta_pct"]["pruned_vs_base"]
        assert e["bridged"]["delta_pct"]["value"] == pytest.approx(100 * (e["bridged"]["ppl"] / e["ppl"]["base"] - 1))
        assert e["bridge"]["recovered_by_bridge"] == pytest.approx(
            1 - (e["bridged"]["ppl"] - e["ppl"]["base"]) / (e["ppl"]["pruned"] - e["ppl"]["base"]))
    again = HealCurves.from_dict(hc.to_dict())  # the JSON keeps the points
    assert again.methods["interchange"][0]["bridged"] == hc.methods["interchange"][0]["bridged"]


def test_without_a_repair_the_bridged_point_is_none():
    h = {"ppl": {"base": 10.0, "pruned": 20.0, "healed": 15.0}, "ppl_ci": {"pruned": [19, 21], "healed": [14, 16]},
         "delta_pct": {"pruned_vs_base": {"value": 100.0}, "healed_vs_base": {"value": 50.0}}}
    p = points(h)
    assert p["bridged"] is None and p["bridge"] is None and p["held_out"] is None
    assert p["raw"] == {"ppl": 20.0, "ppl_ci": [19, 21], "delta_pct": {"value": 100.0}}
    assert p["healed"]["ppl"] == 15.0


def test_cli_healed_curves_with_held_out_text_and_a_bridge(stories_path, wikitext_path, tmp_path, cache_dir, capsys):
    import json

    from swapkl.commands.cli import main

    text = tmp_path / "eval.txt"
    text.write_text(" ".join(from_file(wikitext_path).words[:12_000]))
    js = tmp_path / "hc.json"
    assert main(["heal", str(stories_path), "--method", "bi,angular", "--n", "1", "--steps", "1", "--seq-len", "32",
                 "--batch", "2", "--eval-text", str(text), "--max-words", "300", "--heldout-text", HELDOUT,
                 "--repair", "bridge", "--calib-tokens", "512", "--calib-window", "64", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    d = json.loads(js.read_text())
    for m in ("bi", "angular"):
        (e,) = d["methods"][m]
        assert e["held_out"]["bridged"]["ppl"] > 0 and e["bridged"]["ppl"] > 0
    assert "bridged before training" in out and "held-out (" in out


def test_the_report_figure_draws_the_bridged_start(run):
    from swapkl.healing.figures import heal_figure

    hc = run[0]
    fig = heal_figure(hc)
    bridged = [t for t in fig.data if (t.meta or {}).get("kind") == "bridged"]
    assert {t.meta["method"] for t in bridged} == {"interchange", "replacement"}
    for t in bridged:
        (e,) = hc.methods[t.meta["method"]]
        assert list(t.y) == [e["bridged"]["delta_pct"]["value"]] and t.line.dash == "dot"
