"""Two checkpoints side by side (swapkl.compare, docs/compare.md): the coefficients are scipy's on the emitted
vectors, the bootstrap is paired when the prompts are shared, different depths and contracts are refused in one line,
the transfer's ΔPPL is the plain evaluator's on B with A's set removed, and two prompt seeds of stories260K agree."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from swapkl.compare import agreement as AG
from swapkl.compare.result import CompareResult, compare
from swapkl.contract import Contract
from swapkl.scoring.results import SwapResult

CONTRACT = Contract(pairs="all", prompts=6, tokens=8).to_dict() | {"corpus_sha256": "x" * 64, "corpus_label": "t"}


def synthetic(L: int = 6, P: int = 6, seed: int = 0, contract=None, tokens=None, noise: float = 0.0, base=None):
    """A SwapResult over every pair with per-prompt KLs that grow with the pair's distance (plus noise)."""
    rng = np.random.default_rng(seed)
    vec = {}
    for i in range(L):
        for j in range(i + 1, L):
            mu = (base or {}).get((i, j), 0.05 * (j - i) + 0.01 * i)
            ij, ji, inter = (np.abs(mu + noise * rng.standard_normal(P)) for _ in range(3))
            vec[(i, j)] = {"repl_ij": ij, "repl_ji": ji, "inter": inter * 0.5}
    return SwapResult.from_pair_vectors(L, vec, contract=dict(contract or CONTRACT), identity={"display": f"m{seed}"},
                                        prompt_token_ids=tokens if tokens is not None else [[1, 2, 3]] * P)


def test_coefficients_are_scipys_on_the_emitted_vectors():
    a, b = synthetic(seed=0, noise=0.05), synthetic(seed=1, noise=0.05)
    ag = AG.rank_agreement(a, b, n_boot=200)
    for p in AG.PROTOCOLS:
        x, y = np.array(ag[p]["a"]), np.array(ag[p]["b"])
        m = (a.replacement() if p == "replacement" else a.interchange())
        assert x.tolist() == [m[i, j] for i, j in ag[p]["pairs"]]  # the emitted vector is A's matrix on the pairs
        assert ag[p]["spearman"]["value"] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        assert ag[p]["kendall"]["value"] == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
        for key in ("spearman", "kendall"):
            lo, hi = ag[p][key]["ci"]
            assert -1 <= lo <= hi <= 1
    assert ag["shared_prompts"] and ag["n_pairs"] == 15


def test_a_result_against_itself_agrees_exactly_under_the_paired_bootstrap():
    a = synthetic(seed=0, noise=0.05)
    ag = AG.rank_agreement(a, a, n_boot=100)
    for p in AG.PROTOCOLS:
        assert ag[p]["spearman"]["value"] == pytest.approx(1.0)
        assert ag[p]["spearman"]["ci"] == pytest.approx([1.0, 1.0])  # same draws on both sides
    # other prompts (unpaired draws): the interval is no longer a point
    b = synthetic(seed=0, noise=0.05, tokens=[[4, 5, 6]] * 6)
    ag2 = AG.rank_agreement(a, b, n_boot=100)
    assert not ag2["shared_prompts"]
    assert ag2["replacement"]["spearman"]["ci"][0] < 1.0


def test_different_depths_are_refused_in_one_line():
    with pytest.raises(AG.DepthMismatch) as e:
        AG.rank_agreement(synthetic(L=6), synthetic(L=5))
    assert "\n" not in str(e.value) and "6 layers" in str(e.value) and "5" in str(e.value)


def test_a_contract_difference_is_named_and_the_seed_may_differ():
    with pytest.raises(AG.ContractMismatch) as e:
        AG.rank_agreement(synthetic(), synthetic(contract=CONTRACT | {"tokens": 16}))
    assert "tokens" in str(e.value) and "\n" not in str(e.value)
    assert AG.check_comparable(synthetic(), synthetic(contract=CONTRACT | {"seed": 3})) == {"seed": [0, 3]}


def test_the_json_round_trips_and_holds_spearman_and_kendall_per_protocol(tmp_path):
    r = compare(synthetic(seed=0, noise=0.05), synthetic(seed=1, noise=0.05), n_boot=50)
    d = json.loads(r.to_json(tmp_path / "c.json"))
    for p in AG.PROTOCOLS:
        assert set(d[p]) >= {"spearman", "kendall"} and set(d[p]["spearman"]) == {"value", "ci"}
    back = CompareResult.from_dict(d)
    assert back.agreement["interchange"]["kendall"] == r.agreement["interchange"]["kendall"]
    d["replacement"]["spearman"]["value"] = 7
    d["agreement"]["replacement"]["spearman"]["value"] = 7
    from swapkl.errors import UploadError

    with pytest.raises(UploadError, match="spearman.value"):
        CompareResult.from_dict(d)


# ------------------------------------------------------------------------------------------- stories260K
@pytest.fixture(scope="module")
def two_seeds(stories, tmp_path_factory):
    import os

    from swapkl.scoring.score import score

    os.environ["SWAPKL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    c = Contract(pairs="all", prompts=8, tokens=32, device="cpu")
    return score(stories, c, use_cache=False), score(stories, c.with_(seed=1), use_cache=False)


def test_two_prompt_seeds_of_stories260k_agree(two_seeds):
    a, b = two_seeds
    ag = AG.rank_agreement(a, b, n_boot=200)
    assert not ag["shared_prompts"] and ag["differs"] == {"seed": [0, 1]}
    for p in AG.PROTOCOLS:
        ma = a.replacement() if p == "replacement" else a.interchange()
        mb = b.replacement() if p == "replacement" else b.interchange()
        iu = np.triu_indices(a.num_layers, 1)
        rho = stats.spearmanr(ma[iu], mb[iu]).statistic  # computed here from the matrices
        assert ag[p]["spearman"]["value"] == pytest.approx(rho, abs=1e-12)
        assert rho > 0.8  # the same model under two prompt draws ranks its pairs alike


def test_the_transfer_delta_is_the_plain_evaluators_on_b_with_as_set_removed(stories, two_seeds, wikitext_path,
                                                                          cache_dir):
    from swapkl.compare.transfer import transfer
    from swapkl.measure import evaluate as E
    from swapkl.measure.memo import EvalMemo
    from swapkl.scoring.corpora import load_corpus
    from swapkl.surgery.blocks import pruned_copy

    b = two_seeds[0]
    # A: B's scores reversed (the least redundant pair looks the most), so A's choice differs from B's
    rev = {p: 1.0 / (0.01 + b.interchange()[p]) for p in b.pairs}
    a = synthetic(L=b.num_layers, P=b.num_prompts, contract=b.contract, base=rev)
    ev = E.Evaluator("tiny", max_words=800, window=128, stride=64)
    corpus = load_corpus(str(wikitext_path))
    t = transfer(stories, a, b, 2, ev, corpus, memo=EvalMemo())
    ids = E.eval_ids(corpus, stories.tokenizer, ev)
    base = E.evaluate_ppl(stories.model, ids, ev.window, ev.stride)
    assert t["baseline_ppl"] == pytest.approx(base.ppl, rel=1e-9)
    rows = t["protocols"]["interchange"]
    assert rows and any(not r["same"] for r in rows)
    for r in rows:
        for key, removed in (("delta_a", r["set_a"]), ("delta_b", r["set_b"])):
            plain = E.evaluate_ppl(pruned_copy(stories.model, removed), ids, ev.window, ev.stride)
            assert r[key] == pytest.approx(100.0 * (plain.ppl / base.ppl - 1.0), rel=1e-9, abs=1e-9)
        assert r["diff"] == pytest.approx(r["delta_a"] - r["delta_b"], rel=1e-9, abs=1e-9)
        lo, hi = r["ci"]
        assert r["word"] == ("tie" if lo <= 0 <= hi else "worse" if lo > 0 else "better")
        if r["same"]:
            assert r["diff"] == 0 and r["word"] == "tie"


# ------------------------------------------------------------------------------------------- the command
def test_the_command_compares_two_score_files_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    from swapkl.commands.cli import main

    fa, fb, f5 = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "five.json"
    synthetic(seed=0, noise=0.05).save(fa)
    synthetic(seed=1, noise=0.05).save(fb)
    synthetic(L=5).save(f5)
    out = tmp_path / "out.json"
    assert main(["compare", str(fa), str(fb), "--json", str(out), "--n-boot", "50", "--quiet"]) == 0
    d = json.loads(out.read_text())
    ag = AG.rank_agreement(SwapResult.load(fa), SwapResult.load(fb), n_boot=50)
    for p in AG.PROTOCOLS:
        assert d[p]["spearman"] == ag[p]["spearman"] and d[p]["kendall"] == ag[p]["kendall"]
    assert d["transfer"] is None and d["a"]["contract"] == d["b"]["contract"]
    capsys.readouterr()
    for argv, words in (([str(fa), str(f5)], "different depth"), ([str(fa), str(tmp_path / "no.json")], "does not exist"),
                        ([str(fa), str(fb), "--budget", "-1"], "--budget")):
        assert main(["compare", *argv, "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and words in err and "\n" not in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "swapkl.result/1", "num_layers": "six"}')
    assert main(["compare", str(fa), str(bad), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.json" in err and "\n" not in err


def test_the_dashboards_compare_job_computes_the_transfer_and_is_served_from_its_snapshot(stories_path, tmp_path,
                                                                                          monkeypatch, wikitext_path):
    from swapkl.jobs.manager import JobManager
    from swapkl.jobs.requests import CompareRequest

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SWAPKL_CORPUS", str(wikitext_path))
    req = CompareRequest(model_a=str(stories_path), model_b=str(stories_path),
                         contract=Contract(pairs="all", prompts=4, tokens=16, device="cpu"), budget=1,
                         evaluator={"name": "tiny", "max_words": 800, "window": 128, "stride": 64})
    assert "compare:" in req.label() and "budget 1" in req.label()
    kw = {"root": tmp_path / "dash", "log_path": tmp_path / "log.txt"}
    m = JobManager(**kw)
    try:
        job = m.submit(req)
        assert job.wait(300) and job.status == "done", job.error
        rows = job.comparison.transfer["protocols"]["interchange"]
        assert [r["n"] for r in rows] == [1] and rows[0]["same"] and rows[0]["word"] == "tie"  # one model on both sides
        assert job.comparison.agreement["interchange"]["spearman"]["value"] == pytest.approx(1.0)
    finally:
        m.shutdown()
    m2 = JobManager(**kw)
    try:
        again = m2.submit(req)
        assert again.wait(30) and again.from_snapshot
        assert again.comparison.to_dict()["transfer"] == job.comparison.to_dict()["transfer"]
    finally:
        m2.shutdown()


def test_the_command_scores_a_model_side_under_the_files_contract_and_transfers(stories_path, tmp_path, cache_dir,
                                                                                 wikitext_path, capsys):
    from swapkl.commands.cli import main
    from swapkl.compare.sources import spec_of

    fb = tmp_path / "b.json"
    W = str(wikitext_path)
    assert main(["score", str(stories_path), "--pairs", "all", "--prompts", "4", "--tokens", "16", "--seed", "1",
                 "--corpus", W, "--device", "cpu", "--json", str(fb), "--quiet"]) == 0
    b = SwapResult.load(fb)
    assert spec_of(b.identity) == str(stories_path)  # B's checkpoint, named by its file, is loaded for the transfer
    out = tmp_path / "c.json"
    assert main(["compare", str(stories_path), str(fb), "--budget", "1", "--max-words", "800", "--eval-text", W,
                 "--device", "cpu", "--n-boot", "50", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    d = json.loads(out.read_text())
    assert d["a"]["source"] == "scored here" and d["b"]["source"] == f"scores file {fb}"
    ca, cb = d["a"]["contract"], d["b"]["contract"]
    assert {k for k in ca if ca[k] != cb.get(k)} == set()  # A was scored under B's file's contract, seed included
    assert d["transfer"]["evaluator"]["max_words"] == 800 and d["transfer"]["protocols"]["interchange"][0]["n"] == 1
    assert "transfer to B" in text and "Spearman" in text
