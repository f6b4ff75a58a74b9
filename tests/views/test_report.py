"""swapkl.views.report and ``python -m swapkl report``: the HTML holds the contract, the verdict, the figures and the
numbers of the result."""
from __future__ import annotations

import html
import json
import re

import numpy as np
import pandas as pd
import pytest

from swapkl.removal.curves import curves_provenance
from swapkl import views as plots
from swapkl.views import report
from swapkl.errors import SwapklError
from swapkl.removal.curves import CurvesResult
from swapkl.scoring.verdict import regime_verdict
from support.cli_run import run_cli
from test_plots import fake_curves, synthetic


def figure_json(doc: str, k: int) -> dict:
    """The data of figure k (1-based) as embedded in the report."""
    m = re.search(rf'Plotly\.newPlot\(\s*"swapkl-fig-{k}",\s*(\[.*?\]),\s*\{{', doc, re.S)
    assert m, f"figure {k} not found"
    return json.loads(m.group(1))


def plain(doc: str) -> str:
    return html.unescape(doc)


def test_report_result_only():
    res = synthetic()
    doc = report.build_report(res)
    cap = plots.contract_caption(res)
    assert html.escape(cap) in doc
    v = regime_verdict(res.replacement(), res.interchange())
    assert html.escape(v["sentence"]) in doc
    assert f"<b>{v['regime']}</b>" in doc
    assert report.figure_count(doc) == 2
    # plotly.js inlined exactly once, nothing fetched from the network
    assert doc.count("plotly.js v") <= 2 and len(doc) > 1_000_000
    assert not re.search(r"<script[^>]+src=", doc)
    # numbers from the result
    s = res.summary()
    text = plain(doc)
    assert f"{s['gap']['mean']:.4f} [{s['gap']['mean_ci'][0]:.4f}, {s['gap']['mean_ci'][1]:.4f}]" in text
    assert f"{s['replacement']['best']:.4f}" in text and f"{s['interchange']['best']:.4f}" in text
    ev = v["evidence"]
    assert f"{ev['replacement']['min']:.4f}" in text and f"{ev['interchange']['median']:.4f}" in text
    top = plots.top_pairs_table(res, k=10)
    for _, r in top.iterrows():
        assert f"<td class=\"l\">{r['repl_pair']}</td><td>{r['d_repl']:.4f}</td>" in doc
    # the embedded heatmaps hold the library's matrices
    fig1 = figure_json(doc, 1)
    assert fig1[1]["z"][1][2] == pytest.approx(res.interchange()[1, 2])
    assert fig1[1]["z"][0][2] is None
    # the CSV downloads carry the contract line
    import base64
    links = re.findall(r'href="data:text/csv;base64,([^"]+)"', doc)
    assert len(links) == 2
    assert base64.b64decode(links[0]).decode().startswith("# contract: " + cap + "\n")


def test_report_everything(tmp_path):
    res = synthetic()
    curves = fake_curves()
    stats = pd.DataFrame({"step": [0, 100, 1000], "gap_mean": [0.01, 0.05, 0.2], "gap_median": [0.0, 0.04, 0.1],
                          "gap_p75": [0.02, 0.06, 0.3], "gap_max": [0.1, 0.2, 0.9], "kl_ratio_mean": [1, .8, .5],
                          "kl_ratio_median": [1, .7, .4], "pearson": [.99, .9, .7]})
    depth = pd.DataFrame({"depth": [0.1, 0.9], "gap": [0.2, 0.4], "i": [0, 3], "j": [1, 4]})
    out = tmp_path / "r.html"
    doc = report.build_report(res, curves, (stats, depth), title="My <report>", out=out)
    assert out.read_text() == doc
    assert "<title>My &lt;report&gt;</title>" in doc
    # 2 (scores) + 2 (curves, KL to base) + 4 (trajectory)
    assert report.figure_count(doc) == 8
    text = plain(doc)
    assert "Baseline perplexity 10.000 [9.500, 10.500]" in text
    assert "<td class=\"l\">2, 4</td>" in doc and "<td class=\"l\">1, 3</td>" in doc  # removed layers table
    assert html.escape(plots.contract_caption(curves_provenance(curves))) in doc
    # the curves figure holds the CurvesResult numbers
    figs = [figure_json(doc, k) for k in range(1, 9)]
    curve_fig = figs[2]
    rep = next(t for t in curve_fig if (t.get("meta") or {}).get("method") == "replacement")
    assert rep["y"] == pytest.approx([6.0, 12.0])
    traj_gap = figs[4]
    assert next(t for t in traj_gap if t["name"] == "max")["y"] == pytest.approx([0.1, 0.2, 0.9])


def test_report_from_trajectory_json_and_curves_only():
    from swapkl.trajectory.checkpoints import CheckpointSpec
    from swapkl.trajectory.compute import Trajectory
    a, b = synthetic(), synthetic()
    t = Trajectory(specs=[CheckpointSpec("m", "step0", 0, "m@step0"), CheckpointSpec("m", "step10", 10, "m@step10")],
                   results=[a, b], contract=dict(a.contract))
    doc = report.build_report(trajectory=t.to_dict())
    assert report.figure_count(doc) == 4
    assert "m@step0" in doc and "3 prompts × 8 tokens" in plain(doc)
    # curves alone: model from the curves, the stored verdict is shown
    c = fake_curves()
    c["baseline"] = {}
    # a verdict as regime_verdict writes it (the dashboard reads every evidence field, so files must hold them)
    proto = lambda m: {"n_pairs": 4, "below_0.05": 0, "below_threshold": int(m < 0.1), "min": m,
                       "median": 2 * m, "best_pair": [1, 2]}
    c["verdict"] = {"regime": "divergent", "prefer": "interchange", "sentence": "Divergent regime: test.",
                    "evidence": {"threshold": 0.1, "replacement": proto(0.2), "interchange": proto(0.05)}}
    doc = report.build_report(curves=CurvesResult.from_json(json.dumps(c)))
    assert "Divergent regime: test." in doc and report.figure_count(doc) == 2
    assert "toy-model" in doc
    with pytest.raises(SwapklError, match="nothing to report"):
        report.build_report()
    with pytest.raises(SwapklError, match="not a swapkl score result"):
        report.build_report({"foo": 1})


def test_report_without_adjacent_pairs_says_so():
    vec = {(0, 2): {"repl_ij": [0.3, 0.3], "repl_ji": [0.2, 0.2], "inter": [0.1, 0.1]}}
    from swapkl.scoring.results import SwapResult
    r = SwapResult.from_pair_vectors(4, vec, contract=synthetic().contract, identity=synthetic().identity)
    doc = report.build_report(r)
    assert "adjacent pairs" in doc and 'class="note"' in doc and report.figure_count(doc) == 2


@pytest.fixture(scope="module")
def scores_json(stories_path, tmp_path_factory):
    """A 'python -m swapkl score --json' file of stories260K (all pairs, 4 prompts x 16 tokens)."""
    d = tmp_path_factory.mktemp("rep")
    out = d / "scores.json"
    r = run_cli("score", str(stories_path), "--device", "cpu", "--pairs", "all", "--prompts", "4", "--tokens", "16",
                "--json", str(out), "--quiet", env_extra={"SWAPKL_CACHE": str(d / "cache")})
    assert r.returncode == 0, r.stderr
    return out


def test_cli_report_from_scores(scores_json, tmp_path):
    out = tmp_path / "report.html"
    r = run_cli("report", "--scores", str(scores_json), "--out", str(out),
                env_extra={"SWAPKL_CACHE": str(tmp_path / "empty-cache")})
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "empty-cache").exists()  # no model computation
    doc = out.read_text()
    d = json.loads(scores_json.read_text())
    from swapkl.scoring.results import SwapResult
    res = SwapResult.from_json(d)
    cap = plots.contract_caption(res)
    assert "stories260K" in cap and "4 prompts × 16 tokens" in cap
    assert html.escape(cap) in doc
    v = regime_verdict(res.replacement(), res.interchange())
    assert html.escape(v["sentence"]) in doc and v["sentence"] in r.stdout
    assert report.figure_count(doc) == 2
    assert f"{d['summary']['gap']['median']:.4f}" in doc
    assert figure_json(doc, 1)[0]["z"][0][1] == pytest.approx(d["replacement"][0][1])
    assert "2 figures" in r.stderr
    # with a trajectory file too (the 'trajectory --json' format)
    from swapkl.trajectory.checkpoints import CheckpointSpec
    from swapkl.trajectory.compute import Trajectory
    t = Trajectory(specs=[CheckpointSpec("m", "step0", 0, "m@step0"), CheckpointSpec("m", "step9", 9, "m@step9")],
                   results=[synthetic(), synthetic()], contract=synthetic().contract)
    tj = tmp_path / "traj.json"
    tj.write_text(t.to_json())
    r = run_cli("report", "--scores", str(scores_json), "--trajectory", str(tj), "--out", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    doc = out.read_text()
    assert report.figure_count(doc) == 6 and "m@step9" in doc


def test_cli_report_errors(tmp_path):
    r = run_cli("report", "--out", str(tmp_path / "x.html"), process=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "give MODEL" in r.stderr
    r = run_cli("report", "--scores", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    r = run_cli("report", "--scores", str(bad), "--out", str(tmp_path / "y.html"))
    assert r.returncode == 2 and "not a swapkl score result" in r.stderr


def test_cli_report_computes_scores_and_curves(stories_path, tmp_path, monkeypatch):
    """MODEL without files: scores through api.score (cached), curves through curves.removal_curves (stubbed
    here: the real evaluation takes a minute on this machine)."""
    from swapkl.commands import cli
    from swapkl.removal import curves as curves_mod

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    seen = {}

    def fake_removal_curves(model, tokenizer, scores, plan, hooks):
        seen.update(scores=scores, budget=plan.budget, methods=list(plan.methods), evaluator=plan.evaluator,
                    identity=hooks.identity)
        c = fake_curves()
        return CurvesResult(**{k: c[k] for k in ("model", "evaluator", "corpus", "budget", "selection",
                                                 "baseline_ppl", "baseline_ppl_ci", "methods")}, baseline={})

    monkeypatch.setattr(curves_mod, "removal_curves", fake_removal_curves)
    out = tmp_path / "r.html"
    rc = cli.main(["report", str(stories_path), "--device", "cpu", "--pairs", "adjacent", "--prompts", "4",
                   "--tokens", "16", "--budget", "2", "--methods", "replacement,interchange", "--out", str(out),
                   "--quiet"])
    assert rc == 0
    assert seen["budget"] == 2 and seen["methods"] == ["replacement", "interchange"]
    assert seen["evaluator"] == "matched" and seen["identity"]["display"] == "stories260K"
    assert seen["scores"]["replacement"].shape == (5, 5)
    assert np.isnan(seen["scores"]["interchange"][0, 2])  # adjacent pairs only
    doc = out.read_text()
    assert report.figure_count(doc) == 4
    assert "pairs adjacent · 4 prompts × 16 tokens" in plain(doc)
    # the scores went through the cache
    assert any((tmp_path / "cache").rglob("*"))
