"""Evidence, second part: the set-level agreement (pooled within n; scipy on the emitted vectors; a monotone
transform gets 1; the measured costs equal a plain evaluator), contract comparisons other than the prompt seed
(another corpus, another dtype, the 4-bit guard), and the evidence section of the HTML report."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from scipy import stats

from swapkl.errors import SwapklError
from swapkl.evidence import sets as SA

QUICK = ["--max-words", "800", "--prompts", "4", "--tokens", "32", "--boot", "20", "--boot-agreement", "50",
         "--calib-tokens", "256", "--quiet"]


def _cli(args, capsys):
    from swapkl.commands.cli import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def ev(tmp_path_factory, stories_path, wikitext_path):
    """One ``swapkl evidence --json`` run on stories260K (small contract, budget 2) with its own cache."""
    from swapkl.commands.cli import main

    root = tmp_path_factory.mktemp("evsets")
    old = os.environ.get("SWAPKL_CACHE")
    os.environ["SWAPKL_CACHE"] = str(root / "cache")
    try:
        out = root / "ev.json"
        assert main([str(a) for a in ["evidence", stories_path, "--budget", "2", "--eval-text", wikitext_path,
                                      "--json", out, *QUICK]]) == 0
        yield json.loads(out.read_text()), out
    finally:
        if old is None:
            os.environ.pop("SWAPKL_CACHE", None)
        else:
            os.environ["SWAPKL_CACHE"] = old


# ------------------------------------------------------------------------------------------------ coefficients
def _centred_ranks(v, groups):
    out = np.zeros(len(v))
    for g in groups:
        r = stats.rankdata(v[g])
        out[g] = r - r.mean()
    return out


def test_pooled_coefficients_equal_scipy():
    rng = np.random.default_rng(0)
    cost = np.concatenate([rng.uniform(0, 1, 6), 10 + rng.uniform(0, 1, 5), 30 + rng.uniform(0, 1, 4)])
    score = cost + rng.normal(0, 0.4, len(cost))
    score[3] = score[4]  # a tie
    groups = [np.arange(0, 6), np.arange(6, 11), np.arange(11, 15)]
    # one group: scipy's own coefficients
    g = groups[0]
    assert SA.pooled_spearman(score[None], cost[None], [g])[0] == pytest.approx(
        stats.spearmanr(score[g], cost[g]).statistic, abs=1e-12)
    assert SA.pooled_kendall(score[None], cost[None], [g])[0] == pytest.approx(
        stats.kendalltau(score[g], cost[g]).statistic, abs=1e-12)
    # pooled: scipy's Pearson of the ranks centred within each group; Kendall: a plain loop over same-size pairs
    rho = SA.pooled_spearman(score[None], cost[None], groups)[0]
    assert rho == pytest.approx(stats.pearsonr(_centred_ranks(score, groups), _centred_ranks(cost, groups)).statistic,
                                abs=1e-12)
    num = ns = nc = 0.0
    for g in groups:
        for a in range(len(g)):
            for b in range(a + 1, len(g)):
                sx, sy = np.sign(score[g[a]] - score[g[b]]), np.sign(cost[g[a]] - cost[g[b]])
                num, ns, nc = num + sx * sy, ns + abs(sx), nc + abs(sy)
    assert SA.pooled_kendall(score[None], cost[None], groups)[0] == pytest.approx(num / np.sqrt(ns * nc), abs=1e-12)
    # a monotone transform of the cost within each n gets 1, even when it reverses the order across n
    mono = np.log1p(cost) - 10 * np.repeat([0, 1, 2], [6, 5, 4])
    assert SA.pooled_spearman(mono[None], cost[None], groups)[0] == pytest.approx(1.0)
    assert SA.pooled_kendall(mono[None], cost[None], groups)[0] == pytest.approx(1.0)
    assert stats.spearmanr(mono, cost).statistic < 0  # pooled across n it would be wrong


def test_coefficients_compare_and_too_few_sets():
    rng = np.random.default_rng(1)
    cost = np.concatenate([rng.uniform(0, 1, 5), 5 + rng.uniform(0, 1, 5)])
    groups = [np.arange(5), np.arange(5, 10)]
    scores = {"perfect": cost ** 3, "noise": rng.normal(size=10), "one_set": np.r_[cost[:1], [np.nan] * 9],
              "partial": np.r_[cost[:9], np.nan]}
    B = 200
    reps = {k: np.repeat(v[None], B, 0) for k, v in scores.items()}
    widx = rng.integers(0, 10, (B, 10))
    creps = {"ground_truth_ppl": cost[None] + rng.normal(0, 0.01, (B, 10)) * (widx > -1)}
    out = SA.coefficients(scores, {"ground_truth_ppl": cost}, reps, creps, groups)["ground_truth_ppl"]
    assert out["perfect"]["spearman"] == pytest.approx(1.0) and out["perfect"]["pairs"] == 20
    assert out["one_set"]["spearman"] is None and out["one_set"]["pairs"] == 0
    assert out["partial"]["pairs"] == 16 and out["partial"]["spearman"] == pytest.approx(1.0)
    assert out["perfect"]["all_sets"] and not out["partial"]["all_sets"]
    lo, hi = out["noise"]["spearman_ci"]  # the sets are resampled within n: a noise score gets a wide interval
    assert hi - lo > 0.5
    cmp = SA.compare(out)
    assert cmp["best"] == "perfect" and set(cmp["others"]) == {"noise"} and cmp["not_compared"] == ["partial"]
    h = SA.headline(cmp, 10, 20, 2)
    assert h.endswith("(partial: scores only some of the sets, not compared).")
    assert h.startswith("across the 10 distinct sets the methods chose at n = 1..2 (20 pairs of the same size), "
                        "perfect orders their held-out ΔPPL best")
    assert SA.headline(SA.compare({"x": out["one_set"]}), 2, 0, 2).startswith("too few distinct sets")


def test_chosen_sets_and_set_scores():
    methods = {"a": [{"n": 1, "removed": [2]}, {"n": 2, "removed": [2, 3]}],
               "b": [{"n": 1, "removed": [2]}, {"n": 2, "removed": [1, 3]}], "c": [{"n": 1, "removed": [0]}]}
    found = SA.chosen_sets(methods, 2)
    assert [(f["n"], f["set"], f["methods"]) for f in found] == [
        (1, [2], ["a", "b"]), (1, [0], ["c"]), (2, [2, 3], ["a"]), (2, [1, 3], ["b"])]
    v = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    assert SA.additive(v, [[2], [1, 3]]).tolist() == [4.0, 10.0]
    ang = np.random.default_rng(2).uniform(size=(3, 6, 6))
    bs = SA.block_scores(ang, [[2, 3], [1, 3]])
    assert bs[0] == pytest.approx(ang[:, 2, 4].mean()) and np.isnan(bs[1])
    idx = np.array([[0, 0, 1]])
    assert SA.block_scores(ang, [[2, 3]], idx)[0, 0] == pytest.approx(ang[[0, 0, 1], 2, 4].mean())


# ------------------------------------------------------------------------------------------------ end to end
def test_set_agreement_on_stories(ev, stories_path, wikitext_path):
    import transformers as tf

    from swapkl.measure import evaluate as E
    from swapkl.scoring.corpora import from_file
    from swapkl.surgery.blocks import pruned_copy

    d, _ = ev
    sa = d["set_agreement"]
    assert sa["budget"] == 2 and sa["methods"] == list(SA.SET_METHODS)
    assert {m for e in sa["sets"] for m in e["methods"]} == set(SA.SET_METHODS)
    # the consensus signals are ranks, which do not add up over a set: not scored on sets
    names = [s for s in d["signals"] if not s.startswith("consensus_")] + ["sleb_set", "angular_blocks"]
    assert set(sa["pooled"]["ground_truth_ppl"]) == set(names)
    # the n = 1 sets cost what the ground truth says (the same evaluator and memo)
    for e in sa["sets"]:
        if e["n"] == 1:
            assert e["delta_ppl_pct"] == pytest.approx(d["ground_truth"]["delta_ppl_pct"][e["set"][0]], abs=1e-3)
        assert e["scores"]["bi"] == pytest.approx(sum(d["signals"]["bi"][i] for i in e["set"]))
    # a set of two layers costs what a plain evaluator measures on the pruned copy
    model = tf.AutoModelForCausalLM.from_pretrained(stories_path).eval()
    tok = tf.AutoTokenizer.from_pretrained(stories_path)
    evr = E.Evaluator.from_dict(d["contract"]["evaluator"])
    ids = E.eval_ids(from_file(wikitext_path), tok, evr)
    two = next(e for e in sa["sets"] if e["n"] == 2)
    base = E.evaluate_ppl(model, ids, evr.window, evr.stride, evr.drop_first_target)
    pm = E.evaluate_ppl(pruned_copy(model, two["set"]), ids, evr.window, evr.stride, evr.drop_first_target)
    assert two["delta_ppl_pct"] == pytest.approx(100 * (pm.ppl / base.ppl - 1), rel=1e-5)
    # the reported coefficients equal scipy's on the emitted vectors
    cost = np.array([e["delta_ppl_pct"] for e in sa["sets"]])
    ns = np.array([e["n"] for e in sa["sets"]])
    compared, pooled = 0, {}
    for s in names:
        sc = np.array([np.nan if e["scores"][s] is None else e["scores"][s] for e in sa["sets"]])
        for n in (1, 2):
            m = (ns == n) & np.isfinite(sc)
            got = sa["per_n"]["ground_truth_ppl"][s][str(n)]
            assert got["sets"] == m.sum()
            # reported exactly when there are 3 sets with a non-constant score and cost (else None)
            expect = m.sum() >= 3 and np.ptp(sc[m]) > 0 and np.ptp(cost[m]) > 0
            assert (got["spearman"] is not None) == expect and (got["kendall"] is not None) == expect, (s, n, got)
            if expect:
                compared += 1
                assert got["spearman"] == pytest.approx(stats.spearmanr(sc[m], cost[m]).statistic, abs=1e-12)
                assert got["kendall"] == pytest.approx(stats.kendalltau(sc[m], cost[m]).statistic, abs=1e-12)
        p = sa["pooled"]["ground_truth_ppl"][s]
        groups = [np.flatnonzero((ns == n) & np.isfinite(sc)) for n in (1, 2)]
        assert p["pairs"] == sum(len(g) * (len(g) - 1) // 2 for g in groups)
        assert p["all_sets"] == bool(np.isfinite(sc).all())
        rho = stats.pearsonr(_centred_ranks(sc, groups), _centred_ranks(cost, groups)).statistic \
            if p["pairs"] >= SA.MIN_PAIRS else np.nan
        assert (p["spearman"] is not None) == bool(np.isfinite(rho)), (s, p)
        if np.isfinite(rho):
            compared += 1
            assert p["spearman"] == pytest.approx(rho, abs=1e-12)
            lo, hi = p["spearman_ci"]
            assert -1 <= lo <= hi <= 1
            if p["all_sets"]:
                pooled[s] = rho
    assert compared > 0  # the stories run has coefficients to check (not a run where every one is None)
    # the headline names the signal with the largest pooled ρ among those scoring every set, or says too few
    what = f"the {sa['n_sets']} distinct sets the methods chose at n = 1..2 ({sa['n_pairs']} pairs of the same size)"
    if pooled:
        best = max(pooled, key=pooled.get)
        assert sa["headline"].startswith(f"across {what}, {best} orders their held-out ΔPPL best (pooled ρ = "
                                         f"{pooled[best]:.2f}"), sa["headline"]
    else:
        assert sa["headline"].startswith(f"too few distinct sets to rank: {what}"), sa["headline"]
    from swapkl.evidence.report import text_tables

    assert "set-level agreement" in text_tables(d) and sa["headline"] in text_tables(d)


# ------------------------------------------------------------------------------------------------ contracts
def test_contract_comparisons_corpus_and_dtype(stories, wikitext_path, tmp_path, cache_dir):
    from swapkl.contract import Contract
    from swapkl.evidence import contracts as K
    from swapkl.evidence.signals import swap_signals
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.score import score

    other = tmp_path / "other.txt"
    words = open(wikitext_path, encoding="utf-8").read().split()
    other.write_text(" ".join(words[-30000:][::-1]), encoding="utf-8")  # another text: the words reversed
    c = Contract(prompts=4, tokens=32, corpus=str(wikitext_path))
    res = score(stories, c)
    loads = []

    def loader(dtype):
        loads.append(dtype)
        return load_checkpoint(str(stories.spec.source), dtype=dtype, device="cpu")

    comps = [K.by_corpus(c, str(other)), K.by_dtype(c, "bfloat16", loader)]
    assert comps[0].contract.corpus == str(other) and comps[1].contract.dtype == "bfloat16" and loads == []
    rows = K.agreement(stories, res, comps, 50)
    assert loads == ["bfloat16"]
    assert [r["kind"] for r in rows] == ["corpus", "dtype"]
    assert rows[0]["paired"] is False and rows[1]["paired"] is True  # the same prompt tokens in bf16
    assert rows[0]["contract"]["corpus"] == str(other) and rows[1]["contract"]["dtype"] == "bfloat16"
    res_bf = score(loader("bfloat16"), c.with_(dtype="bfloat16"))
    mine = {s.name: s.values for s in swap_signals(res)}
    theirs = {s.name: s.values for s in swap_signals(res_bf)}
    for name in ("replacement", "interchange"):
        assert rows[1]["spearman"][name] == pytest.approx(stats.spearmanr(mine[name], theirs[name]).statistic)
        assert rows[1]["kendall"][name] == pytest.approx(stats.kendalltau(mine[name], theirs[name]).statistic)
        for key in ("spearman_ci", "kendall_ci"):
            lo, hi = rows[0][key][name]
            assert -1 <= lo <= hi <= 1
    from swapkl.evidence.report import contracts_table

    text = "\n".join(contracts_table({"contracts": rows}))
    assert "other.txt (its prompt region)" in text and "dtype bfloat16" in text and "paired" in text


def test_four_bit_and_bad_dtype_are_refused_in_one_line(stories_path, wikitext_path, cache_dir, capsys):
    import torch

    from swapkl.contract import Contract
    from swapkl.evidence import contracts as K

    with pytest.raises(SwapklError, match="is the main contract's dtype"):
        K.by_dtype(Contract(), "float32", None)
    cases = [(["--compare-dtype", "int8"], "must be one of float32, bfloat16, float16, 4bit"),
             (["--compare-corpus", "/nonexistent/x.txt"], "no such text file")]
    if not torch.cuda.is_available():
        cases.append((["--compare-dtype", "4bit"], "needs CUDA and bitsandbytes; this machine has no CUDA device"))
    for args, pattern in cases:
        code, _, err = _cli(["evidence", stories_path, "--eval-text", wikitext_path, *QUICK, *args], capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], err


# ------------------------------------------------------------------------------------------------ the report
def _cells(html: str, header: str) -> list[list[str]]:
    """The rows of the first table after ``header`` (an <h3> text) as lists of cell texts."""
    tbl = html[html.index(header):]
    tbl = tbl[tbl.index("<table>"):tbl.index("</table>")]
    return [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", tbl)[1:]]


def test_report_evidence_section(ev, tmp_path, capsys, cache_dir):
    import html as H

    from swapkl.evidence.section import agreement_rows, section
    from swapkl.views.captions import html_number
    from swapkl.views.report import build_report, figure_count

    d, path = ev
    # the CLI: an evidence file alone makes a report of its section: the three figures, the headline, the tables
    out = tmp_path / "r.html"
    code, _, err = _cli(["report", "--evidence", path, "--out", out, "--quiet"], capsys)
    assert code == 0, err
    doc = out.read_text()
    assert figure_count(doc) == 3
    assert H.escape(d["headline"]) in doc and H.escape(d["set_agreement"]["headline"]) in doc
    assert "stories260K" in doc and "evaluator matched@800w" in doc
    rows = _cells(doc, "<h3>Agreement with the ground truth</h3>")
    cols = list(agreement_rows(d)[0])
    assert [r[0] for r in rows] == list(d["signals"])
    for r in rows:
        s = r[0]
        assert r[cols.index("ρ vs ΔPPL")] == html_number(d["agreement"]["spearman"][s]["ground_truth_ppl"], 3)
        assert r[cols.index("ρ vs ΔPPL lo")] == html_number(d["agreement"]["spearman_ci"][s]["ground_truth_ppl"][0], 3)
        assert r[cols.index("τ vs KL hi")] == html_number(d["agreement"]["kendall_ci"][s]["ground_truth_kl"][1], 3)
    gt = _cells(doc, "<h3>Ground truth per layer</h3>")
    assert [r[1] for r in gt] == [html_number(v, 4) for v in d["ground_truth"]["delta_ppl_pct"]]
    # with a score result: the figure count rises by exactly 3
    from swapkl.contract import Contract
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.score import score

    res = score(load_checkpoint(d["contract"]["model"]["id"], device="cpu"), Contract(prompts=4, tokens=16))
    assert figure_count(build_report(res, sections=[section(d)])) == figure_count(build_report(res)) + 3
    scores = tmp_path / "scores.json"
    res.to_json(scores)
    code, _, err = _cli(["report", "--scores", scores, "--evidence", path, "--out", out, "--quiet"], capsys)
    assert code == 0 and figure_count(out.read_text()) == figure_count(build_report(res)) + 3, err
    other = dict(d, contract=dict(d["contract"], model=dict(d["contract"]["model"], fingerprint="0" * 16)))
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, _, err = _cli(["report", "--scores", scores, "--evidence", tmp_path / "other.json", "--out", out,
                         "--quiet"], capsys)
    assert code == 2 and err.startswith("error: ") and "are for different models" in err, err
    # the dashboard's one-click report includes it when the session has a finished evidence job
    from swapkl.evidence.run import EvidenceResult
    from swapkl.jobs import reports as jobs_reports

    class Job:
        status, evidence = "done", EvidenceResult(d)

    assert figure_count(jobs_reports.report_html(None, None, Job)) == 3
    Job.status = "running"
    assert jobs_reports.job_sections(Job) == []


@pytest.mark.parametrize("content, pattern", [
    ('{"layers": [0, 1]}', "not a swapkl evidence file"),
    ('{"layers": [0, 1], "ground_truth": {"delta_ppl_pct": [1], "kl": [1]}, "signals": {}, "agreement": {}, '
     '"stability": {}, "contract": {}}', "malformed evidence"),
    ("[1, 2", "JSON"),
])
def test_report_refuses_a_bad_evidence_file(tmp_path, capsys, cache_dir, content, pattern):
    f = tmp_path / "ev.json"
    f.write_text(content)
    code, _, err = _cli(["report", "--evidence", f, "--out", tmp_path / "r.html", "--quiet"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], err
