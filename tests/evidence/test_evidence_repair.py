"""Evidence after repair: the bridged ground truth equals a plain implementation (deep copy, plain lstsq bridge,
evaluate_ppl), its cache returns the same numbers, and the agreement with it equals scipy + a plain bootstrap."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import WIKITEXT
from support.bridge_plain import plain_activations, plain_bridged
from swapkl.errors import SwapklError
from swapkl.evidence.bridged_truth import bridged_ground_truth
from swapkl.measure.evaluate import Evaluator, delta_pct, eval_ids, evaluate_ppl
from swapkl.repair.bridged_kl import BridgeSettings
from swapkl.repair.calibration import calibration_text
from swapkl.scoring.corpora import load_corpus
from swapkl.scoring.prompts import make_prompts

EV = Evaluator("tiny", 300, 128, 64)


@pytest.fixture(scope="module")
def setup(stories):
    corpus = load_corpus(str(WIKITEXT))
    prompts = make_prompts(stories.tokenizer, corpus, 4, 32, seed=0)
    settings = BridgeSettings(calib_tokens=2048, calib_window=128, ridge=0.0)
    calib = calibration_text(stories.tokenizer, corpus, prompts.description, 32, settings.calib_tokens,
                             settings.calib_window, settings.calib_seed)
    ids = eval_ids(corpus, stories.tokenizer, EV)
    return corpus, settings, calib, ids


def _bridger(ck, corpus, settings):
    """The bridges of ``settings`` calibrated outside the fixture's scoring prompts (4 × 32 tokens, seed 0)."""
    from swapkl.contract import Contract
    from swapkl.repair.bridger import Bridger

    return Bridger(ck.model, ck.tokenizer, corpus, settings, Contract(prompts=4, tokens=32))


def _store(ck):
    return {"text": "text-key", "identity": ck.identity}


def _plain_delta(model, ids, calib, ell):
    """ΔPPL % and mean KL of block ``ell`` removed with its plain bridge: residual at block 0, folded after."""
    form = "residual" if ell == 0 else "folded"
    act = plain_activations(model, calib.ids, {ell, ell + 1}, ell - 1 if form == "folded" else None)
    x, y = (act[ell], act[ell + 1]) if form == "residual" else (act["m"], act[ell + 1] - act[ell] + act["m"])
    W = np.linalg.lstsq(x, y, rcond=None)[0]
    plain = plain_bridged(model, {(ell, ell + 1): W}, form)
    base = evaluate_ppl(model, ids, EV.window, EV.stride, capture_reference=True)
    r = evaluate_ppl(plain, ids, EV.window, EV.stride, reference=base.reference)
    return delta_pct(r, base), r.kl_to_base, form


def test_bridged_ground_truth_equals_plain(stories, setup, cache_dir):
    corpus, settings, calib, ids = setup
    layers = [0, 2, 4]  # residual at block 0, folded inside, folded before the final norm
    gt, rec = bridged_ground_truth(_bridger(stories, corpus, settings), ids, EV, _store(stories),
                                   layers=layers)
    assert gt.computed == 3 and gt.layers == layers
    for k, ell in enumerate(layers):
        d, kl, form = _plain_delta(stories.model, ids, calib, ell)
        assert gt.delta_ppl_pct[k] == pytest.approx(d, rel=1e-3, abs=1e-3)
        assert gt.kl[k] == pytest.approx(kl, rel=1e-3, abs=1e-5)
        lo, hi = gt.delta_ppl_pct_ci[k]
        assert lo <= gt.delta_ppl_pct[k] <= hi
        assert rec["forms"][str(ell)]["form"] == form
    assert rec["forms"]["0"]["note"] and "block 0" in rec["forms"]["0"]["note"]
    assert rec["settings"]["calib_tokens"] == 2048 and rec["calibration"]["windows"] == 16
    # the raw ground truth's windows, one for one
    from swapkl.evidence.ground_truth import ground_truth
    from swapkl.measure.memo import EvalMemo

    raw_gt = ground_truth(stories.model, ids, EV, EvalMemo(), "k", layers=layers)
    np.testing.assert_array_equal(gt.counts, raw_gt.counts)
    np.testing.assert_allclose(gt.base_nll, raw_gt.base_nll, rtol=1e-5)
    # the raw cut of block 2 costs more than the bridged one (the bridge repairs something)
    raw = evaluate_ppl(arch_pruned(stories.model, [2]), ids, EV.window, EV.stride)
    base = evaluate_ppl(stories.model, ids, EV.window, EV.stride)
    assert delta_pct(raw, base) > gt.delta_ppl_pct[1]
    # a second call reads the store entry: same numbers, nothing computed
    again, _ = bridged_ground_truth(_bridger(stories, corpus, settings), ids, EV, _store(stories),
                                    layers=layers)
    assert again.computed == 0 and again.delta_ppl_pct == gt.delta_ppl_pct and again.kl == gt.kl
    assert list((cache_dir / "evidence").glob("bridged-truth-*.json"))
    # other bridge settings are another entry
    other = BridgeSettings(calib_tokens=2048, calib_window=128, ridge=1e-2)
    third, rec3 = bridged_ground_truth(_bridger(stories, corpus, other), ids, EV, _store(stories),
                                       layers=layers)
    assert third.computed == 3 and rec3["settings"]["ridge"] == 1e-2


def arch_pruned(model, remove):
    from swapkl.surgery.blocks import pruned_copy

    return pruned_copy(model, remove)


# ------------------------------------------------------------------------------------ agreement after repair
class _R:  # the fields of a PPLResult that from_results reads
    def __init__(self, nll, counts, kl):
        self.nll, self.counts, self.kl = np.asarray(nll, float), np.asarray(counts), np.asarray(kl, float)
        self.ppl = float(np.exp(self.nll.sum() / self.counts.sum()))


def _fake_truths(L=7, W=10, seed=0):
    from swapkl.evidence.ground_truth import from_results

    rng = np.random.default_rng(seed)
    counts = rng.integers(80, 120, W)
    base = _R(rng.uniform(200, 300, W), counts, np.zeros(W))
    raw = {k: _R(base.nll + rng.uniform(0, 40 * (k + 1), W), counts, rng.uniform(0, 5, W)) for k in range(L)}
    bridged = {k: _R(base.nll + rng.uniform(0, 30 * ((k * 3) % L + 1), W), counts, rng.uniform(0, 3, W))
               for k in range(L)}
    return from_results(range(L), base, raw), from_results(range(L), base, bridged)


def test_agreement_after_repair_equals_scipy_and_a_plain_bootstrap():
    from scipy import stats

    from swapkl.evidence import agreement as A
    from swapkl.evidence import repair as R
    from swapkl.evidence.signals import Signal

    L, P, B = 7, 6, 200
    raw, bridged = _fake_truths(L)
    rng = np.random.default_rng(5)
    good = np.asarray(bridged.delta_ppl_pct)[None] + rng.normal(0, 20, (P, L))  # per prompt, follows the bridged cost
    other = np.asarray(raw.delta_ppl_pct)[None] + rng.normal(0, 20, (P, L))
    fixed = rng.normal(size=L)
    sigs = [Signal("good", good.mean(0), "t", lambda idx: good[idx].mean(1)),
            Signal("other", other.mean(0), "t", lambda idx: other[idx].mean(1)), Signal("fixed", fixed, "t")]
    names = [s.name for s in sigs]
    vectors = {s.name: s.values for s in sigs} | {R.RAW_GT: np.asarray(raw.delta_ppl_pct),
                                                 R.BRIDGED_GT: np.asarray(bridged.delta_ppl_pct)}
    vectors[R.BRIDGED_GT_KL] = np.asarray(bridged.kl)
    reps = A.replicate_vectors(sigs, raw, P, B,
                               extra_truths={R.BRIDGED_GT: (bridged, "ppl"), R.BRIDGED_GT_KL: (bridged, "kl")})
    table = R.rho_table(names, R.BRIDGED_GT, vectors, reps)
    kl_table = R.rho_table(names, R.BRIDGED_GT_KL, vectors, reps)
    # the plain implementation: one generator, the prompt draws then the window draws, scipy per replicate
    g = np.random.default_rng(0)
    pidx, widx = g.integers(0, P, (B, P)), g.integers(0, len(bridged.counts), (B, len(bridged.counts)))
    c = bridged.counts

    def truth_rep(b):
        w = widx[b]
        return 100 * (np.exp((bridged.window_nll[:, w].sum(1) - bridged.base_nll[w].sum()) / c[w].sum()) - 1)

    plain_sig = {"good": lambda b: good[pidx[b]].mean(0), "other": lambda b: other[pidx[b]].mean(0),
                 "fixed": lambda b: fixed}
    rhos = {}
    for s in names:
        assert table[s]["rho"] == pytest.approx(stats.spearmanr(vectors[s], bridged.delta_ppl_pct).statistic,
                                                abs=1e-12)
        rhos[s] = np.array([stats.spearmanr(plain_sig[s](b), truth_rep(b)).statistic for b in range(B)])
        np.testing.assert_allclose(table[s]["ci"], np.percentile(rhos[s], [2.5, 97.5]), atol=1e-12)
        kl_rhos = [stats.spearmanr(plain_sig[s](b), bridged.window_kl[:, widx[b]].sum(1) / c[widx[b]].sum()).statistic
                   for b in range(B)]
        np.testing.assert_allclose(kl_table[s]["ci"], np.percentile(kl_rhos, [2.5, 97.5]), atol=1e-12)
    # the rule: largest ρ, then the paired CI of the difference to the second
    v = R.verdict(A.compare_to(R.BRIDGED_GT, names, vectors, reps))
    first, second = sorted(names, key=lambda s: -table[s]["rho"])[:2]
    assert (v["best"], v["second"]) == (first, second)
    lo, hi = np.percentile(rhos[first] - rhos[second], [2.5, 97.5])
    np.testing.assert_allclose(v["diff_ci"], [lo, hi], atol=1e-12)
    assert v["tie"] == bool(lo <= 0 <= hi)
    s = R.statement(v)
    assert s.startswith(f"after a bridge, {first} predicts the cost best: ρ {table[first]['rho']:.2f} [")
    assert f"vs {second}: Δρ" in s
    assert ("(tie)" if v["tie"] else f"({first} better)") in s
    assert s.endswith("here") == (v["rho_ci"][0] <= 0)


def test_statement_says_tie_when_the_paired_ci_includes_zero():
    from swapkl.evidence import repair as R

    v = {"best": "a", "rho": 0.9, "rho_ci": [0.5, 1.0], "second": "b", "diff": 0.1, "diff_ci": [-0.2, 0.4],
         "tie": True}
    assert R.statement(v) == "after a bridge, a predicts the cost best: ρ 0.90 [0.50, 1.00]; vs b: Δρ 0.10 " \
                             "[-0.20, 0.40] (tie)"
    assert R.statement(v | {"diff_ci": [0.05, 0.4], "tie": False}).endswith("(a better)")
    weak = R.statement(v | {"rho": 0.2, "rho_ci": [-0.3, 0.6]})
    assert weak.endswith("(tie); its ρ CI includes 0 or less: no signal is shown to predict the cost after a bridge "
                         "here")


# ------------------------------------------------------------------------------------------------ the CLI
QUICK = ["--max-words", "800", "--prompts", "4", "--tokens", "32", "--boot", "20", "--boot-agreement", "50",
         "--calib-tokens", "256", "--no-sets", "--regions", "1"]


@pytest.fixture(scope="module")
def repair_run(tmp_path_factory, stories_path, wikitext_path):
    """One ``swapkl evidence --repair bridge`` on stories260K (small evaluator), its own cache: ``(json path, what
    it printed, exit code)``."""
    import contextlib
    import io
    import os

    from swapkl.commands.cli import main

    root = tmp_path_factory.mktemp("evrepair")
    old = os.environ.get("SWAPKL_CACHE")
    os.environ["SWAPKL_CACHE"] = str(root / "cache")
    out, printed = root / "ev.json", io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = main([str(a) for a in ["evidence", stories_path, "--budget", "1", "--eval-text", wikitext_path,
                                          *QUICK, "--repair", "bridge", "--bridge-tokens", "1024", "--calib-window",
                                          "128", "--json", out]])
    finally:
        if old is None:
            os.environ.pop("SWAPKL_CACHE", None)
        else:
            os.environ["SWAPKL_CACHE"] = old
    return out, printed.getvalue(), code


def test_cli_evidence_repair_prints_both_tables_and_the_statement(repair_run, stories_path, capsys):
    import json

    from swapkl.commands.cli import main

    out, printed, code = repair_run
    assert code == 0
    assert "vs raw ground truth" in printed and "vs bridged ground truth" in printed and "vs bridged KL" in printed
    d = json.loads(out.read_text())
    rep = d["repair"]
    assert rep["statement"].startswith("after a bridge, ") and rep["statement"] in printed
    assert "rule: largest Spearman ρ against the bridged ground truth" in printed
    names = set(d["signals"]) | {"bridged_kl"}
    assert set(rep["agreement"]["raw"]) == set(rep["agreement"]["bridged"]) == set(rep["agreement"]["bridged_kl"]) \
        == names
    after = printed.split("After repair:")[1]
    for s in names:  # one table row per signal, the ρ as printed
        row = next(line for line in after.splitlines() if line.strip().startswith(s + " "))
        r = rep["agreement"]["bridged"][s]["rho"]
        assert r is None or f"{r:+.2f}" in row
    # the raw table repeats the evidence's own agreement (same joint bootstrap draws)
    for s in d["signals"]:
        assert rep["agreement"]["raw"][s]["rho"] == pytest.approx(d["agreement"]["spearman"][s]["ground_truth_ppl"])
        assert rep["agreement"]["raw"][s]["ci"] == pytest.approx(d["agreement"]["spearman_ci"][s]["ground_truth_ppl"])
    # every number records its contract: the bridge settings, the calibration region, the evaluator
    c = rep["contract"]
    assert c["bridge"] == {"form": "folded", "calib_tokens": 1024, "calib_window": 128, "calib_seed": 0,
                           "ridge": 1e-4}
    assert "prompt region" in c["calibration"]["region"] and c["calibration"]["windows"] == 8
    assert c["evaluator"]["max_words"] == 800
    gt = rep["ground_truth"]
    assert len(gt["delta_ppl_pct"]) == 5 and gt["n_windows"] == d["ground_truth"]["n_windows"]
    assert gt["forms"]["0"]["form"] == "residual" and gt["forms"]["2"]["form"] == "folded"
    assert len(rep["signal"]["bridged_kl"]) == 5 and all(v > 0 for v in rep["signal"]["bridged_kl"])
    # the per-layer CSV carries the bridged ground truth and the bridged KL under the bridge's caption
    import csv
    import io

    from swapkl.evidence.report import csv_text

    text = csv_text(d)
    assert text.startswith("# ") and "bridge folded, 1024 calibration tokens" in text.splitlines()[0]
    table = list(csv.DictReader(io.StringIO(text.split("\n", 1)[1])))
    assert [float(r["bridged_delta_ppl_pct"]) for r in table] == pytest.approx(gt["delta_ppl_pct"])
    assert [r["bridge_form"] for r in table] == ["residual"] + ["folded"] * 4
    assert [float(r["bridged_kl"]) for r in table] == pytest.approx(rep["signal"]["bridged_kl"])
    # bridge flags without --repair bridge are one line, before any work
    code = main(["evidence", str(stories_path), "--ridge", "0.1"])
    err = capsys.readouterr().err
    assert code != 0 and "go with --repair bridge" in err and "Traceback" not in err
    # a sublayer unit, or settings the bridge cannot use: one line, before the model is loaded
    for argv, msg in ((["--repair", "bridge", "--unit", "attention"], "replaces whole blocks"),
                      (["--repair", "bridge", "--bridge-tokens", "100"], "must be at least the calibration window")):
        code = main(["evidence", str(stories_path), *argv])
        err = capsys.readouterr().err
        assert code != 0 and msg in err and "Traceback" not in err, err


# ------------------------------------------------------------------------------------------------ the page
def test_evidence_page_shows_the_after_repair_table_of_an_opened_file(repair_run, cache):
    import json

    from streamlit.testing.v1 import AppTest

    from support.app_util import APP, TIMEOUT
    from swapkl.evidence import repair as R

    out, _, _ = repair_run
    d = json.loads(out.read_text())
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/evidence.py").run()
    assert not at.exception, at.exception
    at.file_uploader(key="ev_open").set_value(("ev.json", out.read_bytes(), "application/json")).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert "After repair" in [h.value for h in at.subheader]
    assert any(d["repair"]["statement"] in m.value for m in at.markdown)
    table = next(t for t in at.dataframe if "ρ vs bridged ground truth" in t.value.columns)
    assert table.value.to_dict("records") == R.rows(d["repair"])
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    after = next(c for c in charts if c["layout"]["title"]["text"].startswith("After repair"))
    bridged = next(t for t in after["data"] if t["name"] == "vs bridged ground truth")
    assert bridged["y"] == pytest.approx([d["repair"]["agreement"]["bridged"][s]["rho"] for s in bridged["x"]])
    assert "1024 calibration tokens" in after["layout"]["meta"]["contract"]
    assert any("bridge folded, 1024 calibration tokens" in c.value for c in at.caption)
    # a file that is not evidence: one line
    at.file_uploader(key="ev_open").set_value(("bad.json", b'{"layers": 1}', "application/json")).run()
    assert not at.exception and len(at.error) == 1 and "not a swapkl evidence file" in at.error[0].value


def test_report_holds_the_after_repair_section(repair_run, tmp_path, capsys):
    import html
    import json

    from swapkl.commands.cli import main
    from swapkl.views.report import figure_count

    out, _, _ = repair_run
    d = json.loads(out.read_text())
    page = tmp_path / "r.html"
    assert main(["report", "--evidence", str(out), "--out", str(page), "--quiet"]) == 0
    text = html.unescape(page.read_text())
    assert "After repair" in text and d["repair"]["statement"] in text and d["repair"]["rule"] in text
    assert figure_count(page.read_text()) == 4  # the three evidence figures and the after-repair one
    # without the repair part: the three figures only
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({k: v for k, v in d.items() if k != "repair"}))
    assert main(["report", "--evidence", str(plain), "--out", str(tmp_path / "p.html"), "--quiet"]) == 0
    assert figure_count((tmp_path / "p.html").read_text()) == 3
    # a malformed repair part: one line
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d | {"repair": {"statement": "x"}}))
    assert main(["report", "--evidence", str(bad), "--out", str(tmp_path / "b.html"), "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "malformed" in err and "Traceback" not in err


def test_sweep_refuses_a_bridge_of_another_span(stories, setup):
    from swapkl.evidence.ground_truth import single_removal_sweep
    from swapkl.repair.bridge import Bridge

    _, _, _, ids = setup
    with pytest.raises(SwapklError, match=r"the bridge of block 2 spans \[2, 4\)"):
        single_removal_sweep(stories.model, ids, EV.window, EV.stride, bridges={2: Bridge(2, 4, "residual", None)})


def test_bridged_kl_signal_is_the_prompt_mean_of_each_blocks_span():
    from types import SimpleNamespace

    from swapkl.evidence.signals import bridged_kl_signal

    rng = np.random.default_rng(3)
    L, P = 5, 6
    per = rng.uniform(0, 2, (L, P))
    spans = {(ell, ell + 1): {"bridged": per[ell].tolist(), "raw": (per[ell] * 3).tolist()} for ell in range(L)}
    spans[(1, 5)] = {"bridged": [9.0] * P, "raw": [9.0] * P}  # a longer span is not a single block's
    sig = bridged_kl_signal(SimpleNamespace(spans=spans), L)
    assert sig.name == "bridged_kl"
    np.testing.assert_allclose(sig.values, per.mean(1))
    idx = rng.integers(0, P, (7, P))
    np.testing.assert_allclose(sig.resample(idx), np.stack([per[:, row].mean(1) for row in idx]))
