"""Evidence (swapkl.evidence): agreement equals scipy on the emitted vectors, a monotone transform of the ground truth
gets ρ = 1, bootstrap frequencies sum to n, the regions are disjoint, and ``swapkl evidence`` end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from swapkl.evidence import agreement as A
from swapkl.evidence import stability as S
from swapkl.evidence.run import regions
from swapkl.evidence.signals import Signal, pair_layer_min
from swapkl.errors import SwapklError
from swapkl.evidence.ground_truth import from_results
from swapkl.removal.selection import layer_scores


class _R:  # the fields of a PPLResult that from_results reads
    def __init__(self, nll, counts, kl=None):
        self.nll, self.counts, self.kl = np.asarray(nll, float), np.asarray(counts), kl
        self.ppl = float(np.exp(self.nll.sum() / self.counts.sum()))


def _fake_gt(L=8, W=12, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.full(W, 100)
    base = _R(rng.uniform(200, 300, W), counts)
    removed = {k: _R(base.nll + rng.uniform(0, 50 * (k + 1), W), counts, rng.uniform(0, 10 * (k + 1), W))
               for k in range(L)}
    return from_results(range(L), base, removed)


def test_vectorised_coefficients_equal_scipy():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 5, (20, 9)).astype(float)  # ties on purpose
    b = rng.normal(size=(20, 9))
    b[:, 3] = b[:, 4]
    sp = A.spearman_rows(a, b)
    kt = A.kendall_rows(a, b)
    for r in range(20):
        if np.ptp(a[r]) == 0:
            continue
        assert sp[r] == pytest.approx(stats.spearmanr(a[r], b[r]).statistic, abs=1e-12)
        assert kt[r] == pytest.approx(stats.kendalltau(a[r], b[r]).statistic, abs=1e-12)


def test_reported_coefficients_equal_scipy_on_emitted_vectors_and_monotone_gets_one():
    gt = _fake_gt()
    rng = np.random.default_rng(2)
    noisy = np.asarray(gt.delta_ppl_pct) + rng.normal(0, 30, 8)
    P = 10
    per_prompt = noisy[None] + rng.normal(0, 5, (P, 8))
    sigs = [Signal("noisy", per_prompt.mean(0), "test", lambda idx: per_prompt[idx].mean(1)),
            Signal("monotone", np.exp(np.asarray(gt.delta_ppl_pct) / 100.0), "test"),
            Signal("random", rng.normal(size=8), "test")]
    vectors = {s.name: s.values for s in sigs}
    vectors["ground_truth_ppl"], vectors["ground_truth_kl"] = np.asarray(gt.delta_ppl_pct), np.asarray(gt.kl)
    reps = A.replicate_vectors(sigs, gt, P, 300)
    ag = A.agreement(vectors, reps)
    emitted = json.loads(json.dumps(vectors, default=lambda x: x.tolist()))
    for a in emitted:
        for b in emitted:
            if a == b:
                continue
            assert ag["spearman"][a][b] == pytest.approx(stats.spearmanr(emitted[a], emitted[b]).statistic, abs=1e-12)
            assert ag["kendall"][a][b] == pytest.approx(stats.kendalltau(emitted[a], emitted[b]).statistic, abs=1e-12)
            lo, hi = ag["spearman_ci"][a][b]
            assert -1 <= lo <= hi <= 1
    assert ag["spearman"]["monotone"]["ground_truth_ppl"] == pytest.approx(1.0)
    assert ag["kendall"]["monotone"]["ground_truth_ppl"] == pytest.approx(1.0)
    cmp = A.compare_to("ground_truth_ppl", [s.name for s in sigs], vectors, reps)
    assert cmp["best"] == "monotone"
    assert cmp["others"]["random"]["verdict"] in ("worse", "indistinguishable")
    assert A.headline(cmp).startswith("on this checkpoint monotone predicts")


def test_ground_truth_resample_is_paired_with_the_baseline():
    gt = _fake_gt()
    idx = np.arange(len(gt.counts))[None]
    d, k = gt.resampled(idx)
    assert d[0] == pytest.approx(gt.delta_ppl_pct) and k[0] == pytest.approx(gt.kl)
    for i in range(len(gt.layers)):
        assert gt.delta_ppl_pct_ci[i][0] <= gt.delta_ppl_pct[i] <= gt.delta_ppl_pct_ci[i][1]


def test_pair_layer_min_equals_the_guided_rule_layer_score():
    rng = np.random.default_rng(3)
    L = 6
    pairs = [(i, j) for i in range(L) for j in range(i + 1, L) if j - i <= 2]
    v = rng.uniform(size=len(pairs))
    d = np.full((L, L), np.nan)
    for p, (i, j) in enumerate(pairs):
        d[i, j] = d[j, i] = v[p]
    assert pair_layer_min(pairs, v[None], L)[0] == pytest.approx(layer_scores(d))


@pytest.mark.parametrize("rule", ["lowest", "guided"])
def test_bootstrap_frequencies_sum_to_n_for_each_resample(rule):
    rng = np.random.default_rng(4)
    L, P = 12, 16
    per_prompt = rng.uniform(size=(P, L)) + np.linspace(0, 0.5, L)[None]
    idx = S.prompt_bootstrap(P, 200)
    reps = per_prompt[idx].mean(1)
    cands, spacing = (list(range(L)), 0) if rule == "lowest" else (list(range(1, L - 1)), 1)
    out = S.signal_stability(per_prompt.mean(0), reps, 4, cands, spacing)
    assert list(out) == ["1", "2", "3", "4"]
    for n in range(1, 5):
        sets = [S.pick(r, n, cands, spacing) for r in reps]
        m = S.memberships(sets, L)
        assert (m.sum(1) == n).all()  # every resample's set has n layers
        assert sum(out[str(n)]["frequency"]) == pytest.approx(n)
        assert out[str(n)]["unstable"] == (out[str(n)]["same_set"] < 0.8)
    # identical prompts: nothing moves
    flat = np.repeat(per_prompt[:1], P, 0)
    same = S.signal_stability(flat.mean(0), flat[idx].mean(1), 3, cands, spacing)
    assert all(v["same_set"] == 1.0 and not v["unstable"] for v in same.values())


def test_regions_are_disjoint(wikitext_path, stories_path):
    import transformers as tf

    from swapkl.removal import methods as M
    from swapkl.measure.evaluate import get_evaluator
    from swapkl.measure.memo import EvalMemo
    from swapkl.scoring.corpora import from_file, from_text
    from swapkl.scoring.prompts import make_prompts

    corpus = from_file(wikitext_path)
    ev = get_evaluator("matched")
    r = regions(corpus, ev)
    assert r["evaluation"] == [0, 5000] and r["evaluation_2"] == [5000, 10000]
    assert r["prompts_and_calibration"][0] == corpus.split_point >= 10000
    # the texts themselves: evaluation = the first words, calibration and prompts = words after the split point
    assert corpus.eval_text(5000) == " ".join(corpus.words[:5000])
    tok = tf.AutoTokenizer.from_pretrained(stories_path)
    ctx = M.MethodContext(model=None, tokenizer=tok, scores={}, num_layers=5, candidates=[], spacing=0,
                          partners=None, corpus=corpus, evaluator=ev, seeds=[], memo=EvalMemo())
    calib = tok.decode(ctx.calib_ids(64))
    assert " ".join(corpus.words[corpus.split_point:corpus.split_point + 5]) in calib
    prompts = make_prompts(tok, corpus, 4, 32, 0, "auto")
    assert "prompt region" in prompts.description["region"]
    # a corpus too short for two regions has one; one too short for the evaluator fails
    short = from_text(" ".join(f"w{i}" for i in range(12000)), "short")
    assert "evaluation_2" not in regions(short, ev)
    with pytest.raises(SwapklError, match="words of evaluation text"):
        regions(from_text(" ".join(f"w{i}" for i in range(4000)), "tiny"), ev)


# ------------------------------------------------------------------------------------------------ the CLI
def _cli(args, capsys):
    from swapkl.commands.cli import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


QUICK = ["--max-words", "800", "--prompts", "4", "--tokens", "32", "--boot", "20", "--boot-agreement", "50",
         "--calib-tokens", "256", "--quiet"]


def test_cli_evidence_json_keys(stories_path, wikitext_path, tmp_path, cache_dir, capsys):
    out = tmp_path / "ev.json"
    code, _, err = _cli(["evidence", stories_path, "--budget", "2", "--eval-text", wikitext_path,
                         "--evaluator", "matched", "--json", out, *QUICK], capsys)
    assert code == 0, err
    d = json.loads(out.read_text())
    assert {"layers", "ground_truth", "signals", "agreement", "stability", "contract"} <= set(d)
    assert d["layers"] == [0, 1, 2, 3, 4]
    assert set(d["ground_truth"]) >= {"delta_ppl_pct", "kl"} and len(d["ground_truth"]["kl"]) == 5
    assert set(d["signals"]) == {"replacement", "interchange", "consensus_mean", "consensus_max", "bi_prompts",
                                 "angular", "bi", "cka", "taylor", "sleb"}
    names = set(d["signals"]) | {"ground_truth_ppl", "ground_truth_kl"}
    assert set(d["agreement"]["spearman"]) == names and set(d["agreement"]["kendall"]) == names
    def vec(a):  # a signal or ground truth as emitted (None: not scored, e.g. the consensus at layers 0 and L-1)
        v = d["signals"].get(a, d["ground_truth"]["delta_ppl_pct"] if a == "ground_truth_ppl" else d["ground_truth"]["kl"])
        return np.array([np.nan if x is None else x for x in v], float)
    for a in names:
        for b in names:
            if a != b and d["agreement"]["spearman"][a][b] is not None:
                m = np.isfinite(vec(a)) & np.isfinite(vec(b))
                assert d["agreement"]["spearman"][a][b] == pytest.approx(
                    stats.spearmanr(vec(a)[m], vec(b)[m]).statistic, abs=1e-9)
    assert set(d["stability"]["bi_prompts"]) == {"1", "2"}
    for v in d["stability"]["bi_prompts"].values():
        assert set(v) >= {"frequency", "same_set"} and len(v["frequency"]) == 5
    assert d["contract"]["evaluator"]["max_words"] == 800 and d["contract"]["regions"]["evaluation"] == [0, 800]
    assert d["region"]["region_2"]["words"] == [800, 1600]
    assert d["headline"].startswith("on this checkpoint ")
    _check_views(d)
    # a second run reads every ground-truth evaluation back from the cache
    out2 = tmp_path / "ev2.json"
    code, _, err = _cli(["evidence", stories_path, "--budget", "2", "--eval-text", wikitext_path,
                         "--json", out2, *QUICK], capsys)
    d2 = json.loads(out2.read_text())
    assert code == 0 and d2["timing"]["ground_truth_computed"] == 0
    assert d2["ground_truth"] == d["ground_truth"] and d2["signals"] == d["signals"]
    assert list((cache_dir / "evidence").glob("signals-*.json"))  # the signals came from the store
    assert list((cache_dir / "evidence").glob("sets-b2-*.json"))  # and the sets the methods chose
    assert d2["set_agreement"] == d["set_agreement"]


@pytest.mark.parametrize("args, pattern", [
    (["--budget", "0"], "at least 1"),
    (["--budget", "9"], "between 1 and 4"),
    (["--boot", "3"], "at least 10"),
    (["--max-words", "-5"], "must be positive"),
    (["--eval-text", "/nonexistent/x.txt"], "no such text file"),
])
def test_cli_hostile_input(stories_path, wikitext_path, cache_dir, capsys, args, pattern):
    base = ["evidence", stories_path, "--eval-text", wikitext_path, *QUICK]
    code, _, err = _cli(base + args, capsys)
    assert code == 2 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], err


def test_cli_refuses_to_overwrite_the_model(stories_path, tmp_path, capsys, cache_dir):
    import shutil

    m = tmp_path / "m"
    shutil.copytree(stories_path, m)
    before = {p.name: p.read_bytes() for p in m.iterdir()}
    code, _, err = _cli(["evidence", m, "--json", m / "config.json", *QUICK], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"error: --json {m / 'config.json'} would overwrite config.json of the input folder {m.resolve()}; "
        "choose another file"], err
    assert {p.name: p.read_bytes() for p in m.iterdir()} == before  # the model folder is untouched
    assert not cache_dir.exists()  # refused before any model load or scoring


def _check_views(d):
    """The three figures and the CSV carry the numbers of the JSON and its contract."""
    from swapkl.evidence.figures import evidence_figures
    from swapkl.evidence.report import csv_text, text_tables

    figs = evidence_figures(d)
    assert set(figs) == {"agreement", "ground_truth", "stability"}
    hm = figs["agreement"].data[0]
    names = list(hm.x)
    assert names[-2:] == ["ground_truth_ppl", "ground_truth_kl"]
    i, j = names.index("interchange"), names.index("ground_truth_ppl")
    assert hm.z[i][j] == d["agreement"]["spearman"]["interchange"]["ground_truth_ppl"]
    lo, hi = d["agreement"]["spearman_ci"]["interchange"]["ground_truth_ppl"]
    assert f"[{lo:.2f}, {hi:.2f}]" in hm.text[i][j]
    bars = figs["ground_truth"].data
    assert list(bars[0].y) == pytest.approx(d["ground_truth"]["delta_ppl_pct"])
    assert len(bars) == 2 + len(d["signals"])  # the bars, the ground-truth rank, one rank trace per signal
    strip = figs["stability"].data[0]
    assert len(strip.y) == sum(len(v) for v in d["stability"].values())
    for f in figs.values():
        assert "stories260K" in f.layout.meta["contract"] and "evaluator matched@800w" in f.layout.meta["contract"]
    csv = csv_text(d).splitlines()
    assert csv[0].startswith("# ") and len(csv) == 2 + len(d["layers"])
    assert "rank agreement" in text_tables(d)


def test_sleb_prefill_equals_plain_first_step(stories_path, wikitext_path):
    import transformers as tf

    from swapkl.evidence.signals import prefill_sleb
    from swapkl.removal import methods as M
    from swapkl.measure.evaluate import Evaluator
    from swapkl.measure.memo import EvalMemo
    from swapkl.scoring.corpora import from_file

    model = tf.AutoModelForCausalLM.from_pretrained(stories_path).eval()
    tok = tf.AutoTokenizer.from_pretrained(stories_path)
    corpus = from_file(wikitext_path)

    def ctx():
        return M.MethodContext(model=model, tokenizer=tok, scores={}, num_layers=5, candidates=list(range(5)),
                               spacing=0, partners=None, corpus=corpus, evaluator=Evaluator("t", 200, 128, 64),
                               seeds=[], memo=EvalMemo(), params={"sleb": {"calib_tokens": 300}})
    plain = M.get("sleb").func(ctx(), 1).info["steps"][0]["trials"]
    c = ctx()
    prefill_sleb(c, 300)
    misses = c.memo.misses
    fast = M.get("sleb").func(c, 1).info["steps"][0]["trials"]
    assert c.memo.misses == misses  # SLEB's first step read every trial from the prefilled memo
    assert set(fast) == set(plain) and all(fast[k] == pytest.approx(plain[k], rel=1e-5) for k in plain)


def test_contract_agreement(stories_path, cache_dir):
    from swapkl.contract import Contract
    from swapkl.evidence.contracts import agreement as contract_agreement
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.score import score

    from scipy import stats

    ck = load_checkpoint(str(stories_path))
    c = Contract(prompts=4, tokens=32)
    res = score(ck, c)
    other = score(ck, c.with_(seed=1))
    rows = contract_agreement(ck, res, [c, c.with_(seed=1)], 50, True, None)
    # the same contract: the same prompts, so the bootstrap is paired and every replicate agrees perfectly
    assert rows[0]["paired"] is True
    assert rows[0]["spearman"] == {"replacement": pytest.approx(1.0), "interchange": pytest.approx(1.0)}
    assert rows[0]["spearman_ci"] == {"replacement": pytest.approx([1.0, 1.0]), "interchange": pytest.approx([1.0, 1.0])}
    # another prompt seed: other prompts (independent bootstraps) and the coefficients scipy gives on the two
    # results' per-layer scores (each layer's smallest swap-KL over its scored pairs, computed here by hand)
    assert rows[1]["contract"]["seed"] == 1 and rows[1]["paired"] is False
    assert not np.array_equal(np.asarray(res.prompt_token_ids), np.asarray(other.prompt_token_ids))

    def layer_min(m):
        m = np.asarray(m, float)
        return np.array([np.nanmin(np.r_[m[i, :], m[:, i]]) for i in range(len(m))])

    for name, a, b in (("replacement", res.replacement(), other.replacement()),
                       ("interchange", res.interchange(), other.interchange())):
        x, y = layer_min(a), layer_min(b)
        assert not np.allclose(x, y)  # the two contracts measured different values: the comparison is not trivial
        assert rows[1]["spearman"][name] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        assert rows[1]["kendall"][name] == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
        lo, hi = rows[1]["spearman_ci"][name]
        assert -1 <= lo <= hi <= 1 and hi - lo > 0  # independent draws of 4 prompts: a real interval
