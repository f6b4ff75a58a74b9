"""``swapkl evidence --tasks``: the task ground truth (swapkl.evidence.task_truth) on stories260K and the local fixture
task.  A block's ΔAcc equals lm-eval's evaluation of the same pruned model (in memory, and lm-eval's own CLI on the
exported folder); ρ with the accuracy loss equals scipy on the emitted vectors and its CI equals a plain loop over the
joint resamples (prompts, windows and documents, replicate b drawn together); the consensus signals equal
consensus order; bad input is one line with exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from support.local_task import write_lastword_task

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TASKS = ROOT / "tests" / "fixtures" / "tasks"
TASK = "tinystories_mc"
LIMIT = 40
QUICK = ["--max-words", "800", "--prompts", "4", "--tokens", "32", "--boot", "20", "--boot-agreement", "50",
         "--calib-tokens", "256", "--no-sets", "--regions", "1", "--quiet"]
TASK_ARGS = ["--tasks", TASK, "--include-path", FIXTURE_TASKS, "--limit", str(LIMIT)]


def _main(args, cache: Path, mp) -> int:
    from swapkl.commands.cli import main

    mp.setenv("SWAPKL_CACHE", str(cache))
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.chdir(ROOT)  # the fixture task's data file path is relative to the checkout (as for lm_eval's CLI)
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def run(stories_path, wikitext_path, tmp_path_factory):
    """One ``evidence --tasks`` run on stories260K (40 documents of the fixture task)."""
    mp = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("ev-tasks") / "ev.json"
    try:
        rc = _main(["evidence", stories_path, "--budget", "1", "--eval-text", wikitext_path, *QUICK, *TASK_ARGS,
                    "--json", out], tmp_path_factory.mktemp("ev-cache"), mp)
    finally:
        mp.undo()
    assert rc == 0
    return json.loads(out.read_text())


def test_json_keys_and_contract(run):
    from swapkl.schema.evidence import evidence_fields

    t = run["task_truth"]
    assert t["tasks"] == [TASK] and t["n_docs"] == {TASK: LIMIT} and t["metric"] == {TASK: "acc,none"}
    assert len(t["delta_acc"][TASK]) == len(run["layers"]) == 5
    assert t["acc_loss"] == [-x for x in t["delta_acc"][TASK]]  # one task: the loss is −ΔAcc
    for (lo, hi), (dlo, dhi) in zip(t["acc_loss_ci"], t["delta_acc_ci"][TASK]):  # the same draws, negated
        assert lo == pytest.approx(-dhi, abs=1e-12) and hi == pytest.approx(-dlo, abs=1e-12)
    c = run["contract"]["tasks"]
    assert c["lm_eval_version"] == "0.4.13" and c["limit"] == LIMIT and c["num_fewshot"] is None
    assert c["tasks"][TASK]["versions"] == {TASK: 1.0} and c["n-shot"] == {TASK: 0}
    assert run["headline_acc"].startswith("on this checkpoint ")
    assert evidence_fields(run) is run
    ta = t["truths_agreement"]
    assert ta["spearman"] == pytest.approx(stats.spearmanr(run["ground_truth"]["delta_ppl_pct"],
                                                           t["acc_loss"]).statistic, abs=1e-12)
    assert ta["spearman_ci"][0] <= ta["spearman_ci"][1]


def test_block_delta_equals_lm_eval_on_the_pruned_copy(run, stories):
    """ΔAcc of block 2 in the evidence equals lm-eval's evaluation of the base and of pruned_copy(model, [2])."""
    from swapkl.measure import lmeval
    from swapkl.measure.task_docs import delta
    from swapkl.surgery.blocks import pruned_copy

    mp = pytest.MonkeyPatch()
    try:
        mp.chdir(ROOT)
        tm, (task,) = lmeval.load_tasks(str(FIXTURE_TASKS), [TASK])
        base = lmeval.evaluate(stories.model, stories.tokenizer, task, tm, limit=LIMIT, batch_size=16)
        pruned = lmeval.evaluate(pruned_copy(stories.model, [2]), stories.tokenizer, task, tm, limit=LIMIT,
                                 batch_size=16)
    finally:
        mp.undo()
    t = run["task_truth"]
    d = delta(base["docs"], pruned["docs"], TASK)
    assert t["delta_acc"][TASK][2] == d["delta"] and t["delta_acc_ci"][TASK][2] == d["ci"]
    assert t["base"][TASK] == pytest.approx(base["metrics"][TASK]["acc,none"], abs=1e-12)
    assert t["base"][TASK] + t["delta_acc"][TASK][2] == pytest.approx(pruned["metrics"][TASK]["acc,none"], abs=1e-12)


def test_block_delta_equals_lm_eval_cli_on_the_exported_folder(run, stories, tmp_path):
    from swapkl.measure.lmeval import rows_of
    from swapkl.surgery.prune import save_pruned

    folder = save_pruned(stories.model, [2], tmp_path / "pruned", tokenizer=stories.tokenizer)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")
    r = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={folder}",
                        "--tasks", TASK, "--include_path", str(FIXTURE_TASKS), "--limit", str(LIMIT),
                        "--batch_size", "16", "--device", "cpu", "--output_path", str(tmp_path / "out")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (res,) = list((tmp_path / "out").rglob("results_*.json"))
    cli = rows_of(json.loads(res.read_text()))["metrics"][TASK]["acc,none"]
    t = run["task_truth"]
    assert round(t["base"][TASK] + t["delta_acc"][TASK][2], 4) == round(cli, 4)


def test_rho_with_accuracy_loss_equals_scipy_on_the_emitted_vectors(run):
    ag, loss = run["agreement"], run["task_truth"]["acc_loss"]
    for s, v in run["signals"].items():
        x = np.array([np.nan if a is None else a for a in v], float)
        m = np.isfinite(x)
        want = stats.spearmanr(x[m], np.asarray(loss)[m]).statistic
        assert ag["spearman"][s]["ground_truth_acc"] == pytest.approx(want, abs=1e-12), s
    assert set(run["comparison"]) == {"ground_truth_ppl", "ground_truth_kl", "ground_truth_acc"}


# ------------------------------------------------------------------------------------ the joint resample, by hand
class _R:  # the fields of a PPLResult that from_results reads
    def __init__(self, nll, counts, kl):
        self.nll, self.counts, self.kl = np.asarray(nll, float), np.asarray(counts), kl
        self.ppl = float(np.exp(self.nll.sum() / self.counts.sum()))


def _small_case(L=6, W=9, P=7, n=15):
    from swapkl.evidence.ground_truth import from_results
    from swapkl.evidence.signals import Signal
    from swapkl.evidence.task_truth import TaskTruth

    rng = np.random.default_rng(5)
    counts = np.full(W, 50)
    base = _R(rng.uniform(100, 150, W), counts, None)
    gt = from_results(range(L), base, {k: _R(base.nll + rng.uniform(0, 9 * (k + 1), W), counts,
                                             rng.uniform(0, 1, W)) for k in range(L)})
    per_prompt = rng.normal(size=(P, L)) + np.arange(L)
    sig = Signal("s", per_prompt.mean(0), "test", lambda idx: per_prompt[idx].mean(1))
    b_docs = {"t": {"doc_id": list(range(n)), "doc_sha": "x", "acc,none": rng.integers(0, 2, n).astype(float).tolist()}}
    docs = {k: {"t": {"doc_id": list(range(n)), "doc_sha": "x",
                      "acc,none": (rng.random(n) < 0.9 - 0.1 * k).astype(float).tolist()}} for k in range(L)}
    tt = TaskTruth(list(range(L)), ["t"], {"t": "acc,none"}, b_docs, docs, {})
    return gt, sig, per_prompt, tt, np.asarray(b_docs["t"]["acc,none"]), np.array([docs[k]["t"]["acc,none"]
                                                                                  for k in range(L)])


def test_rho_ci_equals_a_plain_loop_over_joint_resamples():
    from swapkl.evidence import agreement as A

    gt, sig, per_prompt, tt, a, b = _small_case()
    B, P, W, n = 40, per_prompt.shape[0], len(gt.counts), len(a)
    vectors, ag, cmp = A.against_ground_truth([sig], gt, P, B, task_truth=tt)
    rng = np.random.default_rng(0)  # the documented stream: prompts, then windows, then each task's documents
    pidx, widx, didx = rng.integers(0, P, (B, P)), rng.integers(0, W, (B, W)), rng.integers(0, n, (B, n))
    rho_s, rho_t = [], []
    for r in range(B):
        s_b = per_prompt[pidx[r]].mean(0)
        loss_b = np.array([(a[didx[r]] - b[k][didx[r]]).mean() for k in range(len(b))])
        dppl_b = [100 * (np.exp((gt.window_nll[k][widx[r]].sum() - gt.base_nll[widx[r]].sum())
                                / gt.counts[widx[r]].sum()) - 1) for k in range(len(b))]
        rho_s.append(stats.spearmanr(s_b, loss_b).statistic)
        rho_t.append(stats.spearmanr(dppl_b, loss_b).statistic)
    want = np.percentile([x for x in rho_s if np.isfinite(x)], [2.5, 97.5])
    assert ag["spearman_ci"]["s"]["ground_truth_acc"] == pytest.approx(list(want), abs=1e-12)
    want_t = np.percentile([x for x in rho_t if np.isfinite(x)], [2.5, 97.5])
    assert ag["spearman_ci"]["ground_truth_ppl"]["ground_truth_acc"] == pytest.approx(list(want_t), abs=1e-12)
    assert vectors["ground_truth_acc"] == pytest.approx((a[None] - b).mean(1), abs=1e-15)
    assert cmp["ground_truth_acc"]["best"] == "s"


# ------------------------------------------------------------------------------------------------ consensus
def test_consensus_signals_order_layers_as_the_consensus_method_walks(run):
    from swapkl.evidence import stability as S
    from swapkl.evidence.signals import Signal, consensus_signals
    from swapkl.removal.selection import nested, scan
    from swapkl.scoring.consensus import consensus_order, consensus_scores, walk_scores

    sg = run["signals"]
    L = len(run["layers"])
    for rule in ("mean", "max"):
        want = walk_scores(sg["replacement"], sg["interchange"], range(1, L - 1), rule)
        got = np.array([np.nan if x is None else x for x in sg[f"consensus_{rule}"]], float)
        np.testing.assert_array_equal(got, want)
        # the consensus score, its ties broken as the method breaks them: the same order as the method's walk
        plain = consensus_scores(sg["replacement"], sg["interchange"], range(1, L - 1), rule)
        order = sorted((k for k in range(L) if np.isfinite(got[k])), key=lambda k: (got[k], k))
        assert order == consensus_order(sg["replacement"], sg["interchange"], range(1, L - 1), rule)
        assert all(plain[a] <= plain[b] for a, b in zip(order, order[1:]))
    rng = np.random.default_rng(3)
    pr, pi = rng.random((6, 7)), rng.random((6, 7))
    swap = [Signal("replacement", pr.mean(0), "t", lambda idx: pr[idx].mean(1)),
            Signal("interchange", pi.mean(0), "t", lambda idx: pi[idx].mean(1))]
    idx = rng.integers(0, 6, (5, 6))
    for s in consensus_signals(swap, 7):
        rule = s.name.split("_")[1]
        np.testing.assert_array_equal(s.values, walk_scores(pr.mean(0), pi.mean(0), range(1, 6), rule))
        reps = s.resample(idx)
        for r in range(5):  # each replicate ranks both protocols' scores of the same prompt draw
            np.testing.assert_array_equal(reps[r], walk_scores(pr[idx[r]].mean(0), pi[idx[r]].mean(0),
                                                               range(1, 6), rule))
        # the stability's full-sample sets are the consensus method's walk (its order, the guided rule's spacing)
        walk = nested(scan(consensus_order(pr.mean(0), pi.mean(0), range(1, 6), rule), 2, 1))
        assert [S.pick(s.values, n, list(range(1, 6)), 1) for n in (1, 2)] == walk


# ------------------------------------------------------------------------------------------------ hostile input
@pytest.mark.parametrize("args, pattern", [
    (["--tasks", "no_such_task_xyz", "--include-path", FIXTURE_TASKS], r"unknown lm-eval task 'no_such_task_xyz'"),
    (TASK_ARGS[:4] + ["--limit", "0"], r"--limit must be at least 1 \(got 0\)"),
    (["--limit", "5"], r"--include-path, --limit and --num-fewshot go with --tasks"),
    (["--tasks", " , "], r"--tasks names no task"),
])
def test_hostile_task_input_is_one_line(stories_path, tmp_path, capsys, args, pattern):
    import re

    mp = pytest.MonkeyPatch()
    try:
        rc = _main(["evidence", stories_path, *QUICK, *args], tmp_path / "c", mp)
    finally:
        mp.undo()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert not (tmp_path / "c").exists()  # refused before the model was loaded or anything scored


def test_a_task_built_from_the_held_out_text_is_refused_before_anything_is_computed(stories_path, wikitext_path,
                                                                                   tmp_path, capsys):
    from swapkl.scoring import corpora

    c = corpora.from_file(wikitext_path)
    docs = [{"context": " ".join(c.words[b:b + 40]), "target": c.words[b + 40]} for b in (300, 600)]
    write_lastword_task(tmp_path / "tasks", "ev_leak", docs)
    mp = pytest.MonkeyPatch()
    try:
        rc = _main(["evidence", stories_path, "--budget", "1", "--eval-text", wikitext_path, *QUICK, "--tasks",
                    "ev_leak", "--include-path", tmp_path / "tasks", "--json", tmp_path / "ev.json"], tmp_path / "c", mp)
    finally:
        mp.undo()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and "examples/s]" not in ln]
    assert rc == 2 and not (tmp_path / "ev.json").exists(), err[-2000:]
    assert len(lines) == 1 and "document 0 shares a 20-word passage with the run's held-out text" in lines[0], lines
    assert not (tmp_path / "c" / "ppl").exists()  # no perplexity was evaluated
