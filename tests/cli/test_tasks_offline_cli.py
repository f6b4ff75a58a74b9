"""``swapkl tasks`` offline (docs/tasks.md "Offline tasks"): the shipped task runs with no hub and no include path,
checked disjoint from the run's text; bad input is one ``error:`` line and exit 2 -- an unknown task, a hub task
whose data is not available offline, a task whose documents overlap the run's calibration text.  The default model
solves the shipped task well above chance (slow)."""
from __future__ import annotations

import json

import pytest

from support.cli_run import run_swapkl
from support.local_task import write_lastword_task
from swapkl.measure import lastword as LW

SMALL = ("--budget", "1", "--methods", "replacement", "--include-boundary", "--prompts", "4", "--tokens", "16")


def run_cli(*args, cache, process=False, timeout=300):
    return run_swapkl(*args, env={"SWAPKL_CACHE": str(cache)}, process=process, timeout=timeout)


def one_error(r, pattern: str) -> str:
    import re

    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    # the datasets library's progress bar of a local json task ("Generating test split: ... examples/s") is not an error
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "examples/s]" not in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def test_unknown_task_is_one_line(stories_path, tmp_path):
    r = run_cli("tasks", stories_path, *SMALL, "--tasks", "no_such_task_xyz", cache=tmp_path)
    one_error(r, r"^error: unknown lm-eval task 'no_such_task_xyz'")


def test_a_hub_task_offline_says_its_data_is_not_available_offline(stories_path, tmp_path):
    # a real process with an empty HF cache: hellaswag's data cannot be there
    r = run_swapkl("tasks", stories_path, *SMALL, "--tasks", "hellaswag", process=True,
                   env={"SWAPKL_CACHE": str(tmp_path / "c"), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    line = one_error(r, r"^error: lm-eval task 'hellaswag': its data is not available offline")
    assert f"use the shipped offline task {LW.TASK}, or a local task with --include-path DIR" in line


def test_a_task_built_from_the_calibration_text_is_refused(stories_path, wikitext_path, tmp_path):
    from swapkl.scoring import corpora

    c = corpora.from_file(wikitext_path)
    s = c.split_point
    docs = [{"context": " ".join(c.words[s + b:s + b + 40]), "target": c.words[s + b + 40]} for b in (0, 500, 1000)]
    write_lastword_task(tmp_path / "tasks", "leaky", docs)
    r = run_cli("tasks", stories_path, *SMALL, "--tasks", "leaky", "--include-path", tmp_path / "tasks",
                "--corpus", wikitext_path, cache=tmp_path / "c")
    one_error(r, r"^error: lm-eval task 'leaky' document 0 shares a 20-word passage with the run's calibration "
                 r"text of corpus .*refusing to evaluate a task on text the run reads$")


def test_the_shipped_task_runs_offline_checked_disjoint(stories_path, wikitext_path, tmp_path):
    out = tmp_path / "t.json"
    r = run_cli("tasks", stories_path, *SMALL, "--tasks", LW.TASK, "--limit", "8", "--corpus", wikitext_path,
                "--json", out, cache=tmp_path / "c")
    assert r.returncode == 0, r.stderr[-3000:]
    n = len(LW.read_docs())
    assert f"task {LW.TASK}: version 1.0, chance " in r.stdout
    assert (f"note: task {LW.TASK}: {n} documents checked disjoint from the run's calibration text, scoring prompts "
            f"({n} by recorded word span, 0 by 20-word passages)") in r.stdout
    res = json.loads(out.read_text())
    chance = sum(d["chance"] for d in LW.read_docs()[:8]) / 8
    assert res["contract"]["tasks"][LW.TASK]["chance"] == pytest.approx(chance)
    acc = res["base"]["metrics"][LW.TASK]["acc,none"]
    assert 0.0 <= acc <= 1.0 and res["contract"]["limit"] == 8


@pytest.mark.slow(reason="the built-in default model on 30 documents of the shipped task (~20 s, more when loaded)")
def test_the_default_model_beats_chance_by_a_clear_margin():
    from swapkl.measure import lmeval
    from swapkl.model.checkpoints import load_checkpoint

    ck = load_checkpoint("default", device="cpu")
    tm, [task] = lmeval.load_tasks(None, [LW.TASK])
    rows = lmeval.evaluate(ck.model, ck.tokenizer, task, tm, limit=30)
    acc, err = rows["metrics"][LW.TASK]["acc,none"], rows["stderr"][LW.TASK]["acc,none"]
    chance = lmeval.chance(task, limit=30)
    assert chance < 0.05 and acc >= 4 * chance and acc - chance > 2 * err, (acc, err, chance)
