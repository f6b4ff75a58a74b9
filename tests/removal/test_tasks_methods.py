"""``swapkl tasks`` runs every method of the issue's table (replacement, interchange, recommend, bi, random) on
stories260K and the fixture task: each yields n = 1..budget with lm-eval's metrics and stderrs; random is the mean
over its seeds with each seed's set and metrics; recommend's sets are the ones ``swapkl recommend`` chooses."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TASK = "tinystories_mc"
LIMIT = 8
BUDGET = 2
METHODS = ("replacement", "interchange", "recommend", "bi", "random")
CONTRACT = ["--prompts", "4", "--tokens", "16"]


def _main(args, monkeypatch, cache) -> int:
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def run(stories_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("five")
    mp = pytest.MonkeyPatch()
    try:
        assert _main(["tasks", stories_path, "--methods", ",".join(METHODS), "--budget", BUDGET, "--include-boundary",
                      "--spacing", "0", "--tasks", TASK, "--include-path", ROOT / "tests" / "fixtures" / "tasks",
                      "--limit", LIMIT, "--seeds", "5", *CONTRACT, "--quiet", "--json", d / "tasks.json"],
                     mp, d / "cache") == 0
        assert _main(["recommend", stories_path, "--budget", BUDGET, *CONTRACT, "--quiet", "--json",
                      d / "recommend.json"], mp, d / "cache") == 0
    finally:
        mp.undo()
    return json.loads((d / "tasks.json").read_text()), json.loads((d / "recommend.json").read_text())


def _stderr(p: float) -> float:
    """lm-eval's stderr of a mean accuracy over LIMIT documents (sample standard deviation / sqrt(n))."""
    return (p * (1 - p) / (LIMIT - 1)) ** 0.5


def test_every_method_yields_n_1_to_budget_with_metrics_and_stderr(run):
    d, _ = run
    assert tuple(d["methods"]) == METHODS
    for name, entries in d["methods"].items():
        assert [e["n"] for e in entries] == list(range(1, BUDGET + 1)), name
        for e in entries:
            assert set(e["metrics"][TASK]) == {"acc,none", "acc_norm,none"}, name
            for metric, v in e["metrics"][TASK].items():
                assert 0.0 <= v <= 1.0 and e["stderr"][TASK][metric] is not None, (name, metric)
                if name != "random":
                    assert abs(v * LIMIT - round(v * LIMIT)) < 1e-9  # a fraction of the LIMIT documents
                    assert e["stderr"][TASK][metric] == pytest.approx(_stderr(v))
            if name != "random":
                assert len(e["removed"]) == e["n"] and all(0 <= i < 5 for i in e["removed"])


def test_random_is_the_mean_over_its_seeds(run):
    d, _ = run
    for e in d["methods"]["random"]:
        seeds = e["per_seed"]
        assert e["removed"] is None and e["n_seeds"] == 5 and [s["seed"] for s in seeds] == [0, 1, 2, 3, 4]
        assert all(len(s["removed"]) == e["n"] for s in seeds)
        for metric in ("acc,none", "acc_norm,none"):
            vals = np.array([s["metrics"][TASK][metric] for s in seeds])
            assert e["metrics"][TASK][metric] == pytest.approx(vals.mean())
            assert e["seed_min"][TASK][metric] == vals.min() and e["seed_max"][TASK][metric] == vals.max()
            assert e["stderr"][TASK][metric] == pytest.approx(np.mean([_stderr(v) for v in vals]))
    # a seed's set evaluated by another method too gives the same numbers (one evaluation per set)
    by_set = {tuple(e["removed"]): e["metrics"] for name, es in d["methods"].items() if name != "random" for e in es}
    shared = [(s, by_set[tuple(s["removed"])]) for e in d["methods"]["random"] for s in e["per_seed"]
              if tuple(s["removed"]) in by_set]
    assert shared and all(s["metrics"] == m for s, m in shared)


def test_recommend_sets_are_the_recommend_search_sets(run):
    d, rec = run
    assert [e["removed"] for e in d["methods"]["recommend"]] == [e["removed"] for e in rec["entries"]]
