"""Healed curves (swapkl.healing.multi / curves / compare / figures): several methods' sets at several n healed with
one recipe and one control (trained once), the paired comparison of two methods per n (checked against a plain
recomputation over the same windows; equal sets give exactly 0 and a tie; the headline words follow the CI), the
report section and ``swapkl report --heal``, and the QLoRA guard and configuration.  stories260K, a few steps."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.errors import SwapklError
from swapkl.healing import compare as C
from swapkl.healing.curves import HealCurves, set_key
from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator
from swapkl.removal.plan import RemovalPlan, RunHooks

EV = Evaluator("tiny", 300, 128, 64)
TINY = Recipe(steps=3, rank=2, seq_len=32, batch=2, lr=3e-3, warmup=1, checkpoint_every=2)


def fake_scores(L=5):
    """Interchange prefers layer 2, replacement layer 1 (so their n = 1 sets differ; at n = 3 both take 1, 2, 3)."""
    def one(low):
        d = np.full((L, L), 1.0)
        np.fill_diagonal(d, np.nan)
        d[low, low + 1] = d[low + 1, low] = 0.05
        return d
    return {"interchange": one(2), "replacement": one(1)}


# --------------------------------------------------------------------------------------------- the paired CI
def plain_difference(counts, base, ft, a, b, n_boot=1000, seed=0):
    """The paired bootstrap written out: one resample at a time, every PPL from the same drawn windows."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(counts), size=(n_boot, len(counts)))
    vals = {"before": [], "healed": [], "healed_vs_finetuned": []}
    for row in idx:
        tok = sum(counts[i] for i in row)

        def ppl(x, row=row, tok=tok):
            return float(np.exp(sum(x[i] for i in row) / tok))
        vals["before"].append(100 * (ppl(a["pruned"]) - ppl(b["pruned"])) / ppl(base))
        vals["healed"].append(100 * (ppl(a["healed"]) - ppl(b["healed"])) / ppl(base))
        vals["healed_vs_finetuned"].append(100 * (ppl(a["healed"]) - ppl(b["healed"])) / ppl(ft))
    return {k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in vals.items()}


def synthetic(W=30, seed=1, gap_before=20.0, gap_after=0.0):
    rng = np.random.default_rng(seed)
    counts = rng.integers(80, 120, W)
    base = counts * 3.0 + rng.normal(0, 5, W)
    noise = rng.normal(0, 8, W)
    a = {"pruned": base + 60 + noise, "healed": base + 20 + rng.normal(0, 8, W)}
    b = {"pruned": base + 60 + gap_before + noise, "healed": a["healed"] + gap_after + rng.normal(0, 3, W)}
    return counts, base, base - 10, a, b


def test_paired_ci_equals_a_plain_recomputation_on_the_same_windows():
    counts, base, ft, a, b = synthetic()
    got = C.paired_difference(counts, base, ft, a, b)
    want = plain_difference(counts, base, ft, a, b)
    for k in want:
        assert got[k]["ci"] == pytest.approx(want[k], rel=1e-9, abs=1e-9)
    ppl = {k: float(np.exp(np.sum(v) / counts.sum())) for k, v in
           {"base": base, "ap": a["pruned"], "bp": b["pruned"]}.items()}
    assert got["before"]["value"] == pytest.approx(100 * (ppl["ap"] - ppl["bp"]) / ppl["base"])
    assert got["before"]["word"] == "better"  # A's pruned model is clearly less damaged, window by window
    assert got["healed"]["word"] == "tie" and got["healed"]["tie"]  # the healed difference is noise around 0
    swapped = C.paired_difference(counts, base, ft, b, a)
    assert swapped["before"]["word"] == "worse" and swapped["before"]["value"] == pytest.approx(-got["before"]["value"])
    with pytest.raises(ValueError, match="same windows"):
        C.paired_difference(counts, base, ft, a, {"pruned": b["pruned"][:-1], "healed": b["healed"]})


def test_equal_sets_give_exactly_zero_and_tie():
    counts, base, ft, a, _ = synthetic()
    d = C.paired_difference(counts, base, ft, a, dict(a))
    for k in ("before", "healed", "healed_vs_finetuned"):
        assert d[k]["value"] == 0.0 and d[k]["ci"] == [0.0, 0.0] and d[k]["word"] == "tie"
    s = C.sentence(2, "interchange-guided", "replacement-guided", d, same_set=True)
    assert "same layers" in s and "tie" in s


@pytest.mark.parametrize("before,after,words", [
    ("better", "better", "stays safer"), ("better", "tie", "stops being safer than replacement-guided at n = 4 (a tie"),
    ("better", "worse", "at n = 4 (interchange-guided is now worse"),
    ("tie", "better", "becomes safer"), ("tie", "tie", "is not safer than replacement-guided at n = 4: they tie"),
    ("worse", "worse", "is not safer than replacement-guided at n = 4: interchange-guided is worse")])
def test_headline_words_follow_the_ci(before, after, words):
    ci = {"better": [-5.0, -1.0], "tie": [-2.0, 3.0], "worse": [1.0, 4.0]}

    def part(w):
        lo, hi = ci[w]
        return {"value": (lo + hi) / 2, "ci": [lo, hi], "tie": w == "tie", "word": C.word([lo, hi])}
    d = {"before": part(before), "healed": part(after), "healed_vs_finetuned": part(after)}
    assert d["before"]["word"] == before and d["healed"]["word"] == after
    s = C.sentence(4, "interchange-guided", "replacement-guided", d)
    assert words in s and "at n = 4" in s and s.startswith("after healing")


# --------------------------------------------------------------------------------------------- on stories260K
@pytest.fixture(scope="module")
def curves_run(stories, small_corpus):
    """interchange and replacement at n = 1 and 3, one tiny recipe, no disk cache; every TR.train call recorded."""
    from swapkl.healing import train as TR
    from swapkl.healing.heal import HealSetup
    from swapkl.healing.multi import heal_curves

    calls, real = [], TR.train

    def spy(model, removed, chunks, recipe, *a, **k):
        calls.append(sorted(removed))
        return real(model, removed, chunks, recipe, *a, **k)

    mp = pytest.MonkeyPatch()
    mp.setattr(TR, "train", spy)
    partial, seen = [], []
    try:
        hc = heal_curves(stories.model, stories.tokenizer, fake_scores(),
                         RemovalPlan(3, ("interchange", "replacement"), spacing=0, evaluator=EV), [1, 3], TINY,
                         HealSetup(corpus=small_corpus, use_cache=False, identity=stories.identity),
                         RunHooks(on_partial=partial.append, progress=lambda d, t, m: seen.append((d, t))))
    finally:
        mp.undo()
    return hc, calls, partial, seen


def test_one_recipe_one_control_and_each_methods_own_sets(curves_run):
    from swapkl.removal.selection import select

    hc, calls, partial, seen = curves_run
    sc = fake_scores()
    for m in ("interchange", "replacement"):
        want = select(sc[m], 3, spacing=0)
        assert [e["removed"] for e in hc.methods[m]] == [want[0], want[2]]
    assert hc.methods["interchange"][0]["removed"] != hc.methods["replacement"][0]["removed"]
    # the control trains once, each distinct set once (the n = 3 set is shared): no disk cache, one session
    sets = {tuple(e["removed"]) for v in hc.methods.values() for e in v}
    assert len(sets) == 3 and calls.count([]) == 1 and sorted(map(tuple, calls)) == sorted(sets | {()})
    entries = [e for v in hc.methods.values() for e in v]
    assert len({e["ppl"]["base"] for e in entries}) == 1 and len({e["ppl"]["base_finetuned"] for e in entries}) == 1
    assert hc.recipe["steps"] == TINY.steps and "LoRA r2" in hc.recipe_line()
    assert len(partial) == 4 and seen[-1][0] == seen[-1][1]


def test_paired_comparison_of_the_healed_models(curves_run):
    hc, *_ = curves_run
    w = hc.windows
    (c1, c3) = hc.comparisons
    assert (c1["n"], c1["same_set"], c3["n"], c3["same_set"]) == (1, False, 3, True)
    a, b = w["sets"][set_key(c1["removed_a"])], w["sets"][set_key(c1["removed_b"])]
    want = plain_difference(w["counts"], w["base"], w["base_finetuned"], a, b)
    for k in want:
        assert c1["diff"][k]["ci"] == pytest.approx(want[k], rel=1e-9, abs=1e-9)
        assert c1["diff"][k]["word"] == C.word(c1["diff"][k]["ci"])
    ia, rb = hc.methods["interchange"][0], hc.methods["replacement"][0]  # the difference of the two curves' points
    assert c1["diff"]["healed"]["value"] == pytest.approx(ia["delta_pct"]["healed_vs_base"]["value"]
                                                          - rb["delta_pct"]["healed_vs_base"]["value"])
    assert all(c3["diff"][k]["value"] == 0.0 and c3["diff"][k]["word"] == "tie" for k in c3["diff"])
    assert hc.headline == c1["sentence"] and "at n = 1" in hc.headline  # the largest n where the sets differ
    assert any("same set at n = 3" in n for n in hc.notes)


def test_json_roundtrip_figure_and_report_section(curves_run, tmp_path):
    from swapkl.healing import figures as F
    from swapkl.views.report import Section, build_report, figure_count

    hc, *_ = curves_run
    again = HealCurves.from_dict(json.loads(hc.to_json()))
    assert again.to_dict() == hc.to_dict()
    fig = F.heal_figure(hc)
    dashed = [t for t in fig.data if t.meta["kind"] == "healed"]
    assert len(dashed) == 4 and all(t.line.dash == "dash" for t in dashed)
    tr = next(t for t in dashed if t.meta["method"] == "interchange" and t.meta["delta"] == "healed_vs_base")
    assert list(tr.y) == [e["delta_pct"]["healed_vs_base"]["value"] for e in hc.methods["interchange"]]
    assert "LoRA r2" in fig.layout.meta["contract"]
    import plotly.graph_objects as go

    base = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout={"meta": {"contract": "model x"}})
    over = F.with_healed(base, hc)
    assert len(over.data) == 3 and len(base.data) == 1 and "healed: LoRA r2" in over.layout.meta["contract"]
    focused = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout={"meta": {"contract": "m"}, "yaxis": {"range": [0, 5]}})
    lo, hi = F.with_healed(focused, hc).layout.yaxis.range  # a focused range widens to hold every healed CI
    cis = [c for v in hc.methods.values() for e in v for c in e["delta_pct"]["healed_vs_base"]["ci"]]
    assert lo < min(cis) and hi >= max(max(cis), 5)
    plain = build_report(sections=[Section("other", "<p>no figure</p>")])
    html = build_report(sections=[Section("other", "<p>no figure</p>"), F.section(hc)])
    assert figure_count(html) == figure_count(plain) + 1
    assert "Healing after removal" in html and hc.recipe_line() in html and "paired bootstrap" in html


def test_report_cli_takes_heal_json(curves_run, tmp_path, capsys):
    from swapkl.commands.cli import main
    from swapkl.views.report import figure_count

    hc, *_ = curves_run
    f, out = tmp_path / "heal.json", tmp_path / "r.html"
    hc.to_json(f)
    assert main(["report", "--heal", str(f), "--out", str(out), "--quiet"]) == 0
    html = out.read_text()
    assert figure_count(html) == 1 and hc.recipe_line() in html and hc.headline[1:40] in html
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "swapkl.heal_curves/1", "methods": []}))
    assert main(["report", "--heal", str(bad), "--out", str(tmp_path / "x.html")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err[-1].startswith("error: --heal") and "Traceback" not in "\n".join(err)


def test_cancel_keeps_finished_heals_and_a_rerun_reuses_them(stories, small_corpus, cache_dir):
    """should_stop after the first heal: ComputeInterrupted, the partial curves hold that heal; the rerun (disk
    cache) trains only what was missing and gives the same numbers for the first set."""
    from swapkl.errors import ComputeInterrupted
    from swapkl.healing.heal import HealSetup
    from swapkl.healing.multi import heal_curves

    partial = []
    plan = RemovalPlan(1, ("interchange", "replacement"), spacing=0, evaluator=EV)
    setup = HealSetup(corpus=small_corpus, identity=stories.identity)
    with pytest.raises(ComputeInterrupted):
        heal_curves(stories.model, stories.tokenizer, fake_scores(), plan, [1], TINY, setup,
                    RunHooks(on_partial=partial.append, should_stop=lambda: len(partial) >= 1))
    assert len(partial) == 1 and list(partial[0].methods) == ["interchange"]
    hc = heal_curves(stories.model, stories.tokenizer, fake_scores(), plan, [1], TINY, setup)
    first, second = hc.methods["interchange"][0], hc.methods["replacement"][0]
    assert all(v["cached"] for v in first["training"].values())     # the set and the control: from the cache
    assert not second["training"]["healed"]["cached"] and second["training"]["base_finetuned"]["cached"]
    assert first["ppl"] == partial[0].methods["interchange"][0]["ppl"]


def test_parse_ns_and_bounds(stories, small_corpus):
    from swapkl.healing.multi import heal_curves, parse_ns

    assert parse_ns("1-3") == [1, 2, 3] and parse_ns("2,4") == [2, 4] and parse_ns("1..2,4") == [1, 2, 4]
    for bad in ("x", "0", "3-1x", ""):
        with pytest.raises(SwapklError):
            parse_ns(bad)
    with pytest.raises(SwapklError, match="up to 4"):
        parse_ns("1-6", limit=4)
    with pytest.raises(SwapklError, match="pair"):
        heal_curves(stories.model, stories.tokenizer, None, RemovalPlan(1, ("interchange",)), [1], TINY,
                    pair=("interchange", "bi"))
    with pytest.raises(SwapklError, match=r"n within 1\.\.1"):
        heal_curves(stories.model, stories.tokenizer, None, RemovalPlan(1, ("interchange",)), [2], TINY)


# --------------------------------------------------------------------------------------------- QLoRA (CPU: guard, config)
def test_qlora_guard_and_config(monkeypatch):
    import sys

    import torch

    from swapkl.errors import ContractError, MissingDependency
    from swapkl.healing import qlora as Q

    assert Q.bnb_config_kwargs() == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                     "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}
    cfg = Q.bnb_config()
    assert cfg.load_in_4bit and not cfg.load_in_8bit and cfg.bnb_4bit_quant_type == "nf4"
    assert cfg.bnb_4bit_compute_dtype == torch.bfloat16 and cfg.bnb_4bit_use_double_quant
    with pytest.raises(ContractError, match="needs CUDA"):
        Q.check_available(cuda=False)
    with monkeypatch.context() as m:  # bitsandbytes absent (as on this machine, and anywhere without the extra)
        m.setitem(sys.modules, "bitsandbytes", None)
        with pytest.raises(MissingDependency, match=r"needs bitsandbytes: install swapkl\[qlora\]"):
            Q.check_available(cuda=True)
    if not torch.cuda.is_available():
        from swapkl.healing.heal import check_qlora

        with pytest.raises(ContractError, match="needs CUDA"):
            check_qlora(Recipe(qlora=True))


def test_cli_heal_several_methods_and_n_writes_healed_curves(stories_path, small_corpus, tmp_path, cache_dir, capsys):
    from swapkl.commands.cli import main

    text = tmp_path / "eval.txt"
    text.write_text(" ".join(small_corpus.words))
    js = tmp_path / "curves.json"
    common = ["heal", str(stories_path), "--steps", "2", "--seq-len", "32", "--batch", "2", "--eval-text", str(text),
              "--max-words", "300", "--spacing", "0", "--prompts", "4", "--tokens", "16"]
    assert main(common + ["--method", "interchange,replacement", "--n", "1,2", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    d = json.loads(js.read_text())
    assert d["format"] == "swapkl.heal_curves/1" and set(d["methods"]) == {"interchange", "replacement"}
    assert [c["n"] for c in d["comparisons"]] == [1, 2] and d["headline"] and "headline:" in out
    assert "contract:" in out and "healing: LoRA r8" in out
    for args, pattern in ((["--method", "interchange,replacement", "--n", "1,2", "--out", str(tmp_path / "o")],
                           "--out exports one healed set"), (["--method", "interchange", "--n", "0"], "--n: n must"),
                          (["--method", "interchange,nope", "--n", "1"], "nope")):
        assert main(common + args) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and pattern in err[0], err


def test_qlora_plumbing_runs_on_cpu_without_the_quantisation(monkeypatch):
    """The QLoRA path with the 4-bit step replaced by a plain bfloat16 load on the CPU (no CUDA here): the pruned copy
    is saved and reloaded, prepared by peft for k-bit training, trained with the same LoRA, and its adapter has the
    LoRA path's names and shapes, so the dequantised merge (healed_model) takes it.  Not a test of bitsandbytes."""
    import torch

    from swapkl.healing import qlora as Q
    from swapkl.healing import train as TR
    from conftest import tiny_model

    monkeypatch.setattr(Q, "check_available", lambda cuda=None: None)
    monkeypatch.setattr(Q, "bnb_config", lambda: None)
    monkeypatch.setattr(Q, "DEVICE_MAP", {"": "cpu"})
    model = tiny_model("llama", num_layers=4)
    chunks = torch.randint(1, 96, (8, 24), generator=torch.Generator().manual_seed(0))
    r = Recipe(steps=2, rank=2, seq_len=24, batch=2, qlora=True)
    state, stats = TR.train(model, [1], chunks, r)
    plain, _ = TR.train(model, [1], chunks, Recipe(steps=0, rank=2, seq_len=24, batch=2))
    assert set(state) == set(plain) and all(state[k].shape == plain[k].shape for k in plain)
    assert stats["loss_first"] is not None and stats["steps"] == 2
    healed = TR.healed_model(model, [1], r, state)  # folded into the full-precision pruned copy
    assert next(healed.parameters()).dtype == torch.float32 and healed.config.num_hidden_layers == 3
