"""Task accuracy in a study (docs/study.md, "Task accuracy"): a study row's task numbers equal `swapkl tasks` run
alone on the same sets; its ΔAcc, I vs R and consensus cells are the paired per-document differences of those
numbers; the statements count them."""
from __future__ import annotations

import json

import numpy as np

from support.local_task import write_lastword_task

STORIES = "tests/fixtures/models/stories260K"
WIKI = "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"
METHODS = "replacement,interchange,consensus-mean,consensus-max"
SCORING = ["--prompts", "4", "--tokens", "32", "--corpus", WIKI]
TASKS = ["--include-path", "tests/fixtures/tasks", "--tasks", "tinystories_mc", "--limit", "40"]
T, ACC = "tinystories_mc", "acc,none"


def test_a_study_rows_task_numbers_equal_swapkl_tasks_alone(tmp_path, monkeypatch):
    from swapkl.commands.cli import main
    from swapkl.study.across import consensus_statements, task_statements
    from swapkl.study.result import StudyResult

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c1"))
    out = tmp_path / "study.json"
    assert main(["study", STORIES, *SCORING, "--eval-text", WIKI, "--max-words", "300", "--budget", "2",
                 "--methods", METHODS, "--n-boot", "50", "--no-evidence", *TASKS, "--json", str(out), "--quiet"]) == 0
    study = json.loads(out.read_text())
    row = study["rows"][0]
    assert row["status"] == "done" and study["contract"]["tasks"]["limit"] == 40
    t = row["tasks"]
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c2"))  # nothing shared: `tasks` computes every number again
    alone = tmp_path / "tasks.json"
    assert main(["tasks", STORIES, *SCORING, "--budget", "2", "--methods", METHODS, *TASKS, "--json", str(alone),
                 "--quiet"]) == 0
    a = json.loads(alone.read_text())
    assert t["base"]["metrics"] == a["base"]["metrics"]
    for m in METHODS.split(","):
        assert [(e["n"], e["removed"], e["metrics"]) for e in t["methods"][m]] == \
            [(e["n"], e["removed"], e["metrics"]) for e in a["methods"][m]]
        for e in t["methods"][m]:
            d = e["delta"][T]
            assert d["delta"] == np.float64(e["metrics"][T][ACC]) - np.float64(t["base"]["metrics"][T][ACC]) \
                or abs(d["delta"] - (e["metrics"][T][ACC] - t["base"]["metrics"][T][ACC])) < 1e-12
            assert d["n"] == 40 and (d["ci"][0] <= d["delta"] <= d["ci"][1])
    for x in t["i_vs_r"]:
        acc = {p: t["methods"][p][x["n"] - 1]["metrics"][T][ACC] for p in ("replacement", "interchange")}
        assert abs(x[T]["delta"] - (acc["interchange"] - acc["replacement"])) < 1e-12
        assert x[T]["word"] in ("better", "tie", "worse")
    assert [s["block"] for s in t["singles"]] == [1, 2, 3]  # every block but the boundary ones
    for c in t["consensus"]:
        cells = c[T]
        acc = {m: t["methods"][m][c["n"] - 1]["metrics"][T][ACC] for m in METHODS.split(",")}
        better = max(acc["replacement"], acc["interchange"])
        for m in ("consensus-mean", "consensus-max"):
            assert abs(cells[m]["vs_better"] - (acc[m] - better)) < 1e-12
    pred = t["predictors"][T]
    assert set(pred) == {"replacement", "interchange", "pick"} and -1 <= pred["replacement"]["rho"] <= 1
    ns = [x["n"] for x in row["removal"]["rows"]]  # a 5-layer model under spacing 1: the order may stop at n = 1
    assert [x["n"] for x in row["removal"]["consensus"]] == ns == [x["n"] for x in t["i_vs_r"]]
    r = StudyResult.from_dict(study)
    lines = task_statements(r)
    assert sum("loses less accuracy at n = " in s and "of 1 models" in s for s in lines) == len(ns)
    assert any("predicts single-block accuracy loss better on" in s for s in lines)
    cons = consensus_statements(r)
    assert len(cons) == 4 and all("of 1 models" in s for s in cons)  # two variants x (ΔPPL, ΔAcc)


def test_an_unknown_task_is_refused_in_one_line_before_any_model_loads(cli, monkeypatch):
    import swapkl.model.checkpoints as C

    loads = []
    monkeypatch.setattr(C, "load_checkpoint", lambda *a, **k: loads.append(a) or (_ for _ in ()).throw(AssertionError))
    rc, out, err = cli("study", STORIES, *SCORING, "--eval-text", WIKI, "--max-words", "300", "--budget", "1",
                       "--include-path", "tests/fixtures/tasks", "--tasks", "no_such_task")
    assert rc == 2 and loads == []
    assert err.strip().count("\n") == 0 and "unknown lm-eval task 'no_such_task'" in err


def test_a_task_built_from_the_held_out_text_is_refused_before_any_work(cli, tmp_path):
    from swapkl.scoring import corpora

    c = corpora.from_file(WIKI)
    docs = [{"context": " ".join(c.words[b:b + 40]), "target": c.words[b + 40]} for b in (100, 200)]
    write_lastword_task(tmp_path / "tasks", "heldout_leak", docs)
    rc, out, err = cli("study", STORIES, *SCORING, "--eval-text", WIKI, "--max-words", "300", "--budget", "1",
                       "--include-path", str(tmp_path / "tasks"), "--tasks", "heldout_leak", "--json",
                       str(tmp_path / "s.json"))
    lines = [ln for ln in err.splitlines() if ln.strip() and "examples/s]" not in ln and not ln.startswith("  [")]
    assert rc == 2 and not (tmp_path / "s.json").exists(), err[-2000:]
    assert len(lines) == 1 and "document 0 shares a 20-word passage with the run's held-out" in lines[0], lines


def test_the_table_shows_each_guided_sets_accuracy_change_and_each_protocols_rho():
    from swapkl.study.across import task_columns

    d = {"delta": -0.125, "ci": [-0.2, -0.05]}
    r = {"tasks": {"contract": {"tasks": [T]},
                   "methods": {"replacement": [{"n": 1, "delta": {T: d}}],
                               "consensus-max": [{"n": 2, "delta": {T: {"delta": 0.0, "ci": [None, None]}}}]},
                   "predictors": {T: {"replacement": {"rho": 0.5, "ci": [0.1, 0.8]},
                                      "interchange": {"rho": -0.25, "ci": [-0.6, 0.2]}}}}}
    cols = task_columns(r)
    assert cols[f"{T} n=1 ΔAcc R"] == "-12.5 [-20.0, -5.0]"  # accuracy points, pruned − base
    assert cols[f"{T} n=2 ΔAcc max"] == "0.0"
    assert cols[f"{T} ρ acc-loss replacement"] == "0.50 [0.10, 0.80]"
    assert cols[f"{T} ρ acc-loss interchange"] == "-0.25 [-0.60, 0.20]"
    assert task_columns({"tasks": None}) == {}
