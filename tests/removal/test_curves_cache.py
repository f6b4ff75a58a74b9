"""Removal-curve evaluations persist on disk: an interrupted or repeated run recomputes nothing it finished."""
from __future__ import annotations

import json

import pytest

from swapkl.model.checkpoints import load_checkpoint
from swapkl.scoring.corpora import from_file
from swapkl.errors import ComputeInterrupted
from swapkl.measure.evaluate import Evaluator
from swapkl.measure.memo import EvalMemo, disk_memo
from swapkl.removal.curves import removal_curves
from swapkl.removal.plan import RemovalPlan, RunHooks
from test_removal import scores5

EV = Evaluator("tiny", 200, 128, 64)


@pytest.fixture(scope="module")
def ck(stories_path):
    return load_checkpoint(str(stories_path), device="cpu")


def _curves(ck, corpus, **hooks):
    return removal_curves(ck.model, ck.tokenizer, scores5(), RemovalPlan(2, ("replacement", "interchange"), evaluator=EV),
                          RunHooks(corpus=corpus, identity=ck.identity, **hooks))


def test_interrupted_curves_resume_from_disk(ck, wikitext_path, cache_dir):
    corpus = from_file(wikitext_path)
    evals = iter(range(100))
    with pytest.raises(ComputeInterrupted):
        _curves(ck, corpus, should_stop=lambda: next(evals) > 3)
    files = sorted((cache_dir / "ppl").glob("*/*.json"))
    assert files, "finished evaluations were not kept"
    memo = disk_memo(ck.identity)
    full = _curves(ck, corpus, memo=memo)
    assert memo.disk_hits == len(files)                     # everything finished before the stop is reused
    again = disk_memo(ck.identity)
    second = _curves(ck, corpus, memo=again)
    # a second run computes nothing: every distinct set (baseline included) comes from the folder
    assert again.misses == 0 and again.disk_hits == memo.misses + memo.disk_hits == 4
    fresh = _curves(ck, corpus, memo=EvalMemo())            # same numbers as computing everything in memory
    for m in ("replacement", "interchange"):
        for a, b, c in zip(full.methods[m], second.methods[m], fresh.methods[m]):
            assert a["ppl"] == b["ppl"] == pytest.approx(c["ppl"], rel=1e-12)
            assert a["kl_to_base"] == b["kl_to_base"] == pytest.approx(c["kl_to_base"], rel=1e-9)
    assert full.baseline_ppl == pytest.approx(fresh.baseline_ppl, rel=1e-12)


def test_corrupt_evaluation_file_is_recomputed(ck, wikitext_path, cache_dir):
    corpus = from_file(wikitext_path)
    first = _curves(ck, corpus)
    f = sorted((cache_dir / "ppl").glob("*/*.json"))[-1]
    d = json.loads(f.read_text())
    f.write_text(json.dumps(d)[:40])
    memo = disk_memo(ck.identity)
    with pytest.warns(UserWarning, match="corrupt cache entry"):
        again = _curves(ck, corpus, memo=memo)
    assert memo.misses == 1
    assert again.methods["replacement"][-1]["ppl"] == pytest.approx(first.methods["replacement"][-1]["ppl"], rel=1e-12)


def test_no_identity_means_memory_only():
    assert disk_memo(None).disk is None and disk_memo({"kind": "local"}).disk is None
