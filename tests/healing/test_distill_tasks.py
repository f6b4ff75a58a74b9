"""lm-eval task accuracy after a distillation heal goes through the existing tasks path: the kd control is the base
itself (its task metrics are the base's, with no adapter in the heal cache), and a last-k healed model is read back
from the heal cache.  stories260K, the fixture multiple-choice task, 8 items."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator
from swapkl.scoring.corpora import from_file, from_text

ROOT = Path(__file__).resolve().parents[2]
EV = Evaluator("tiny", 300, 128, 64)


def _scores(L=5):
    d = np.full((L, L), 1.0)
    np.fill_diagonal(d, np.nan)
    d[2, 3] = d[3, 2] = 0.05  # interchange removes layer 2 (or 3) first
    return {"interchange": d, "replacement": d.copy()}


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)  # the fixture task's data file path is relative to the checkout


def test_kd_last_k_heal_task_accuracy_from_the_cache(env, stories, wikitext_path):
    from swapkl.healing.heal import HealSetup
    from swapkl.healing.multi import heal_curves
    from swapkl.healing.tasks import heal_task_accuracy
    from swapkl.removal.plan import RemovalPlan, RunHooks
    from swapkl.measure.task_runner import TaskSettings

    corpus = from_text(" ".join(from_file(wikitext_path).words[:12_000]), name="wiki12k")
    r = Recipe(steps=2, seq_len=32, batch=2, lr=1e-3, warmup=0, objective="kd", part="last-k", last_k=1, top_k=16)
    hc = heal_curves(stories.model, stories.tokenizer, _scores(), RemovalPlan(1, ("interchange",), spacing=0,
                                                                              evaluator=EV),
                     [1], r, HealSetup(corpus=corpus, evaluator=EV, identity=stories.identity))
    (entry,) = hc.methods["interchange"]
    assert entry["ppl"]["base_finetuned"] == entry["ppl"]["base"]  # the kd control is the base
    settings = TaskSettings(("tinystories_mc",), include_path=str(ROOT / "tests" / "fixtures" / "tasks"), limit=8)
    ht = heal_task_accuracy(stories.model, stories.tokenizer, hc, settings, r,
                            hooks=RunHooks(identity=stories.identity))
    assert ht["base_finetuned"] == ht["base"]
    (row,) = ht["methods"]["interchange"]
    assert row["removed"] == entry["removed"] and "tinystories_mc" in row["healed"]["metrics"]
