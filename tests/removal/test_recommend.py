"""recommend: never reads the test text, an unlimited beam is an exhaustive search, never worse than its seeds on
calibration text, stays within SLEB's evaluation budget; the Recommendation round-trips; CLI and report."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from conftest import tiny_model
from swapkl.measure import evaluate as E
from swapkl.scoring.corpora import Corpus, from_text, load_corpus
from swapkl.errors import SwapklError
from swapkl.measure.evaluate import Evaluator
from swapkl.removal.methods import MethodContext
from swapkl.removal.recommend import Recommendation, recommend, search, sleb_cost
from swapkl.measure.memo import EvalMemo
from swapkl.removal.curves import removal_curves
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.removal.recommend import recommend_plan, search_params

EV = Evaluator("tiny", 400, 128, 64)


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _scores(L, seed=0):
    rng = np.random.default_rng(seed)
    d = rng.uniform(0.05, 1.0, (L, L))
    d = (d + d.T) / 2
    np.fill_diagonal(d, np.nan)
    i = rng.uniform(0.02, 0.5, (L, L))
    i = (i + i.T) / 2
    np.fill_diagonal(i, np.nan)
    return {"replacement": d, "interchange": i}


def _ctx(model, tok, corpus, scores, params, calib_ids=None, spacing=0):
    """A context for the search itself: the old rule (the best calibration set) unless ``params`` names one."""
    params = {"rule": "calibration"} | params
    L = len(scores["replacement"])
    ctx = MethodContext(model=model, tokenizer=tok, scores=scores, num_layers=L, candidates=list(range(1, L - 1)),
                        spacing=spacing, partners=None, corpus=corpus, evaluator=EV, seeds=[0, 1, 2, 3, 4],
                        memo=EvalMemo(), params={"recommend": params})
    if calib_ids is not None:
        ctx._calib_ids = calib_ids
    return ctx


def _exhaustive(ctx, L, budget, tokens, stride="evaluator"):
    """The best size-n set by calibration PPL over every subset, scored as the search scores (the evaluator's
    stride by default; None = non-overlapping windows)."""
    step = ctx.evaluator.stride if stride == "evaluator" else stride
    best = {}
    for n in range(1, budget + 1):
        vals = {c: ctx.calib_ppl(list(c), tokens, stride=step) for c in itertools.combinations(range(L), n)}
        best[n] = min(vals, key=lambda c: (vals[c], c))
        best[n] = (sorted(best[n]), vals[best[n]])
    return best


def test_unlimited_beam_is_exhaustive_stories(stories):
    corpus = load_corpus()
    L, budget, tokens = 5, 3, 256
    ctx = _ctx(stories.model, stories.tokenizer, corpus, _scores(L),
               {"width": 10, "top_k": L, "max_evals": None, "calib_tokens": tokens})  # C(5, 2) = 10
    out = search(ctx, budget)
    want = _exhaustive(ctx, L, budget, tokens)
    levels = out.info["recommendation"]["levels"]
    for n in range(1, budget + 1):
        assert out.sets[n - 1] == want[n][0]
        assert levels[n - 1]["calib_ppl"] == pytest.approx(want[n][1], rel=1e-12)
    # every subset was evaluated once (base + 5 + 10 + 10), nothing twice
    assert out.info["recommendation"]["evaluations"] == 1 + 5 + 10 + 10


def test_calibration_windows_follow_the_evaluator(stories):
    """By default a calibration number is scored with the held-out evaluator's window and stride (the plain
    sliding-window PPL on the calibration ids); "disjoint" gives SLEB's non-overlapping windows, and an exhaustive
    search under that objective is matched too."""
    from swapkl.measure.evaluate import evaluate_ppl
    from swapkl.surgery.prune import pruned_copy

    corpus = load_corpus()
    L, tokens = 5, 256
    ctx = _ctx(stories.model, stories.tokenizer, corpus, _scores(L), {"width": 10, "top_k": L, "max_evals": None,
                                                                      "calib_tokens": tokens})
    out = search(ctx, 1)
    ids = ctx.calib_ids(tokens)
    win = min(EV.window, ids.numel())
    assert EV.stride < win  # the two objectives differ on this evaluator
    got = out.info["recommendation"]["levels"][0]["calib_ppl"]
    removed = out.sets[0]
    plain = evaluate_ppl(pruned_copy(stories.model, removed), ids, win, EV.stride).ppl
    assert got == pytest.approx(plain, rel=1e-9)
    assert out.settings["calib_windows"] == "evaluator" and out.settings["calib_stride"] == EV.stride
    ctx_d = _ctx(stories.model, stories.tokenizer, corpus, _scores(L),
                 {"width": 10, "top_k": L, "max_evals": None, "calib_tokens": tokens, "calib_windows": "disjoint"})
    out_d = search(ctx_d, 2)
    want = _exhaustive(ctx_d, L, 2, tokens, stride=None)
    for n in (1, 2):
        assert out_d.sets[n - 1] == want[n][0]
    disjoint = evaluate_ppl(pruned_copy(stories.model, out_d.sets[0]), ids, win, win).ppl
    assert out_d.info["recommendation"]["levels"][0]["calib_ppl"] == pytest.approx(disjoint, rel=1e-9)
    with pytest.raises(SwapklError, match="calib_windows"):
        search(_ctx(stories.model, stories.tokenizer, corpus, _scores(L), {"calib_windows": "overlap"}), 1)


def test_unlimited_beam_is_exhaustive_tiny_random_model():
    model = tiny_model("llama", num_layers=6)
    corpus = from_text("alpha beta gamma " * 200, "tiny-corpus")
    torch.manual_seed(5)
    ids = torch.randint(0, 96, (2048,))  # what BI/CKA seeds read by default; the search reads the first 192
    L, budget, tokens = 6, 3, 192
    ctx = _ctx(model, None, corpus, _scores(L, 1), {"width": 15, "top_k": L, "max_evals": None,
                                                   "calib_tokens": tokens}, calib_ids=ids)  # C(6, 2) = 15
    out = search(ctx, budget)
    want = _exhaustive(ctx, L, budget, tokens)
    for n in range(1, budget + 1):
        assert out.sets[n - 1] == want[n][0]
    # a narrow beam is not exhaustive, but never worse on calibration than any of its seeds, within its cap
    ctx2 = _ctx(model, None, corpus, _scores(L, 1), {"width": 1, "top_k": 2, "calib_tokens": tokens},
                calib_ids=ids)
    out2 = search(ctx2, budget)
    rec = out2.info["recommendation"]
    assert rec["evaluations"] <= sleb_cost(L, budget) == rec["max_evals"]
    for n, lv in enumerate(rec["levels"], start=1):
        assert lv["calib_ppl"] >= want[n][1] - 1e-9
        for src, s in lv["seed_calib"].items():
            if s["calib_ppl"] is not None:
                assert lv["calib_ppl"] <= s["calib_ppl"] + 1e-12, (n, src)


def test_recommend_never_reads_the_test_text(stories, monkeypatch):
    """The search touches only calibration windows cut from the prompt region; the test text is read only after
    the choice, to evaluate the chosen sets."""
    corpus = load_corpus()
    model, tok = stories.model, stories.tokenizer
    tokens = 256
    calls = []
    real = E.evaluate_ppl

    def spy(m, input_ids, *a, **k):
        calls.append(torch.as_tensor(input_ids).reshape(-1).clone())
        return real(m, input_ids, *a, **k)

    def boom(*a, **k):
        raise AssertionError("the search read the evaluation region")

    monkeypatch.setattr(E, "evaluate_ppl", spy)
    monkeypatch.setattr(Corpus, "eval_text", boom)
    monkeypatch.setattr(E, "eval_ids", boom)
    ctx = _ctx(model, tok, corpus, _scores(5), {"calib_tokens": tokens})
    out = search(ctx, 2)
    assert out.sets and calls
    calib = ctx.calib_ids(tokens)
    # the calibration ids are the tokenised start of the prompt region, which is disjoint from the eval region
    prompt_words = corpus.words[corpus.split_point:]
    want = torch.as_tensor(tok(" ".join(prompt_words[:tokens]))["input_ids"])[:tokens]
    assert torch.equal(calib, want)
    assert corpus.split_point >= EV.max_words
    for ids in calls:
        assert torch.equal(ids, calib)
    monkeypatch.undo()
    # end to end: the chosen sets do not depend on the test text (two different evaluation texts, same choice;
    # the calibration windows follow the evaluator's window and stride, so those stay the same)
    old = {"recommend": {"rule": "calibration"}}
    a = recommend(model, tok, _scores(5), recommend_plan(2, search_params(calib_tokens=tokens), evaluator=EV, method_params=old),
                  RunHooks(corpus=corpus, memo=EvalMemo()))
    b = recommend(model, tok, _scores(5), recommend_plan(2, search_params(calib_tokens=tokens), evaluator=Evaluator("tiny2", 900, EV.window, EV.stride), method_params=old),
                  RunHooks(corpus=corpus, memo=EvalMemo()))
    assert [a.removed(n) for n in (1, 2)] == [b.removed(n) for n in (1, 2)] == out.sets
    assert a.entries[0]["delta_pct"] != b.entries[0]["delta_pct"]


def test_recommendation_result_roundtrip_and_explain(stories):
    corpus = load_corpus()
    rec = recommend(stories.model, stories.tokenizer, _scores(5), recommend_plan(2, search_params(calib_tokens=256), evaluator=EV),
                    RunHooks(corpus=corpus, memo=EvalMemo()))
    d = json.loads(rec.to_json())
    back = Recommendation.from_dict(d)
    assert back.to_dict() == rec.to_dict()
    assert back.removed(2) == rec.removed(2) and len(rec.removed(2)) == 2
    s = rec.explain(2)
    assert s.startswith(f"Remove layers {rec.removed(2)} (n=2)") and "calibration PPL" in s and "held-out" in s
    assert "calibration evaluations" in s and s.count(".") >= 1 and "\n" not in s
    # the contract beside the numbers names the calibration text and windows, and the held-out evaluator
    from swapkl import views as plots

    cap = plots.contract_caption(rec)
    assert "calibration 256 tokens of the prompt region, window 128/stride 64" in cap and "evaluator tiny" in cap
    assert plots.contract_caption(back) == cap
    assert rec.stats["evaluations"] <= rec.stats["sleb_evaluations"] == sleb_cost(5, 2)
    e = rec.entry(1)
    assert e["ppl"] > 0 and e["delta_pct_ci"][0] <= e["delta_pct"] <= e["delta_pct_ci"][1]
    tbl = rec.table()
    assert list(tbl["n"]) == [1, 2]
    with pytest.raises(Exception, match="no recommendation for n=3"):
        rec.removed(3)
    with pytest.raises(Exception, match="missing"):
        Recommendation.from_dict({"entries": []})


def test_recommend_is_a_curves_method(stories):
    corpus = load_corpus()
    res = removal_curves(stories.model, stories.tokenizer, _scores(5), RemovalPlan(budget=2, methods=["recommend", "sleb"], evaluator=EV, spacing=0, method_params={"recommend": {"calib_tokens": 256, "calib_windows": "disjoint", "rule": "calibration"}, "sleb": {"calib_tokens": 256}}),
                         RunHooks(corpus=corpus, memo=EvalMemo()))
    rec = Recommendation.from_curves(res)
    assert [e["removed"] for e in res.methods["recommend"]] == [rec.removed(1), rec.removed(2)]
    assert res.method_info["recommend"]["settings"]["label"] == "recommended"
    # same calibration text and windows as SLEB: recommend's choice is at least as good on it at every n
    sleb = res.method_info["sleb"]["steps"]
    for n, lv in enumerate(res.method_info["recommend"]["recommendation"]["levels"], start=1):
        assert lv["calib_ppl"] <= sleb[n - 1]["calib_ppl"] + 1e-12
    from swapkl.views.report import build_report

    html = build_report(curves=json.loads(res.to_json()))
    assert "Recommended removal" in html and rec.explain(1).split(";")[0].replace("[", "").split()[0] in html
    assert f"{rec.removed(2)}" in html


def _err(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [ln for ln in err.splitlines() if ln.strip()][-1]


@pytest.mark.parametrize("args,msg", [(["--budget", "0"], "--budget must be at least 1"),
                                      (["--budget", "2", "--width", "0"], "--width must be at least 1"),
                                      (["--budget", "2", "--max-evals", "x"], "--max-evals must be"),
                                      (["--budget", "2", "--seeds-from", "nope"], "unknown method nope"),
                                      (["--budget", "5"], "budget 5 is larger"),
                                      (["--budget", "2", "--max-words", "100000"], "too short")])
def test_recommend_cli_bad_input(stories_path, capsys, monkeypatch, tmp_path, args, msg):
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    assert main(["recommend", str(stories_path), "--device", "cpu", *args]) == 2
    line = _err(capsys)
    assert line.startswith("error: ") and msg in line


def test_recommend_cli_json(stories_path, capsys, monkeypatch, tmp_path):
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "rec.json"
    assert main(["recommend", str(stories_path), "--device", "cpu", "--budget", "2", "--max-words", "400",
                 "--calib-tokens", "256", "--prompts", "2", "--tokens", "16", "--json", str(out), "--quiet",
                 "--no-cache"]) == 0
    rec = Recommendation.from_json(out)
    assert len(rec.entries) == 2 and rec.evaluator["name"] == "matched@400w"
    assert rec.settings["calib_tokens"] == 256


def test_bench_table_renders_the_committed_results():
    """`python -m experiments run recommend --table FILE` re-renders docs/recommend-results.md's tables from the committed
    JSON: the target check compares recommend with the best other method per n, and the calibration table shows
    recommend's choice as the best calibration PPL among the seeds' sets (the design guarantee)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    path = root / "experiments" / "results" / "recommend-smollm2-135m.json"
    out = subprocess.run([sys.executable, "-m", "experiments.recommend", "--table", str(path)], cwd=root,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    d = json.loads(path.read_text())
    budget = d["curves"]["budget"]
    assert sum(line.startswith("* n=") for line in out.splitlines()) == budget
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert len(rows) == budget
    levels = d["curves"]["method_info"]["recommend"]["recommendation"]["levels"]
    for lv in levels:
        seeds = [e["calib_ppl"] for e in (lv.get("seed_calib") or {}).values() if e.get("calib_ppl") is not None]
        assert all(lv["calib_ppl"] <= v + 1e-9 for v in seeds)
    assert "stride 256" in out  # recorded with the evaluator's calibration windows


def test_spacing_reaches_the_search(stories):
    """``spacing`` is the selection rule's Δ for the whole run: with ``constrained`` the search keeps to the rule's
    candidates (no boundary layer) under that Δ, so Δ=0 allows all three inner layers of stories260K and Δ=1 two."""
    corpus = load_corpus()
    rec = recommend(stories.model, stories.tokenizer, _scores(5), recommend_plan(3, search_params(calib_tokens=128, constrained=True), evaluator=EV, spacing=0, kl=False),
                    RunHooks(corpus=corpus, memo=EvalMemo()))
    assert [sorted(rec.removed(n)) for n in (1, 2, 3)][-1] == [1, 2, 3]
    assert all(set(rec.removed(n)) <= {1, 2, 3} for n in (1, 2))
    with pytest.raises(SwapklError, match="spacing"):
        recommend(stories.model, stories.tokenizer, _scores(5), recommend_plan(3, search_params(calib_tokens=128, constrained=True), evaluator=EV, spacing=1, kl=False),
                  RunHooks(corpus=corpus, memo=EvalMemo()))
