"""``prune --from EVIDENCE.json``: an ``evidence --json`` file of stories260K (a real, small run) exports a signal's
chosen set (its row of the stability table: the rule's set on the full sample) or the ground truth's n cheapest
single layers; the hostile cases are one ``error:`` line with exit code 2 and nothing written."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from test_hostile_cli import one_error_line

from swapkl.surgery.mergekit import kept_from_config


@pytest.fixture(scope="module")
def evidence(stories_path, tmp_path_factory) -> tuple[Path, dict]:
    from swapkl.commands.cli import main

    d = tmp_path_factory.mktemp("ev")
    mp = pytest.MonkeyPatch()
    mp.setenv("SWAPKL_CACHE", str(d / "c"))
    try:
        assert main(["evidence", str(stories_path), "--budget", "2", "--max-words", "600", "--boot", "10",
                     "--boot-agreement", "10", "--regions", "1", "--calib-tokens", "64", "--prompts", "4", "--tokens",
                     "16", "--quiet", "--json", str(d / "ev.json")]) == 0
    finally:
        mp.undo()
    return d / "ev.json", json.loads((d / "ev.json").read_text())


@pytest.mark.parametrize("method, key", [("ground_truth_ppl", "delta_ppl_pct"), ("ground_truth_kl", "kl")])
def test_ground_truth_cheapest_single_layers(stories_path, evidence, tmp_path, cli, method, key):
    path, d = evidence
    expect = sorted(int(i) for i in np.argsort(d["ground_truth"][key], kind="stable")[:2])
    out = tmp_path / "gt.yaml"
    rc, so, se = cli("prune", stories_path, "--from", path, "--method", method, "--n", "2", "--format", "mergekit",
                     "--out", out)
    assert rc == 0, se
    text = out.read_text()
    assert kept_from_config(yaml.safe_load(text)) == [i for i in range(5) if i not in expect]
    assert f"# chosen by: {method}, n=2: the 2 layer(s) cheapest to remove alone (from ev.json)" in text
    assert "# measured on: stories260K" in text and "budget 2" in text


def test_a_signals_chosen_set(stories_path, evidence, tmp_path, cli):
    path, d = evidence
    for signal, per_n in d["stability"].items():
        for n, row in per_n.items():
            out = tmp_path / f"{signal}-{n}.yaml"
            rc, so, se = cli("prune", stories_path, "--from", path, "--method", signal, "--n", n, "--format",
                             "mergekit", "--out", out)
            assert rc == 0, se
            assert kept_from_config(yaml.safe_load(out.read_text())) == [i for i in range(5) if i not in row["set"]]
    # a Hugging Face folder too, checked by reloading
    rc, so, se = cli("prune", stories_path, "--from", path, "--method", "bi_prompts", "--n", "2", "--out",
                     tmp_path / "hf", "--verify")
    assert rc == 0 and f"removed layers {d['stability']['bi_prompts']['2']['set']}, 3 of 5 kept" in so, se


def test_hostile_evidence_files(stories_path, evidence, tmp_path, cli):
    path, d = evidence
    bad_set = copy.deepcopy(d)
    bad_set["stability"]["angular"]["1"]["set"] = ["x"]
    wrong_size = copy.deepcopy(d)
    wrong_size["stability"]["angular"]["1"]["set"] = [1, 2]
    other = copy.deepcopy(d)
    other["contract"]["model"]["num_layers"] = 30
    files = {}
    for name, doc in (("bad", bad_set), ("size", wrong_size), ("other", other)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))
    cases = [
        ((path, None, 1), r"is an evidence file: give --method, one of replacement, interchange, .*ground_truth_kl$"),
        ((path, "replacement", 2), r"replacement has no point n=2$"),
        ((path, "ground_truth_ppl", 5), r"ground_truth_ppl has no point n=5$"),
        ((path, "angular", 0), r"--n must be at least 1"),
        ((files["bad"], "angular", 1), r"angular at n=1 is malformed in this evidence file$"),
        ((files["size"], "angular", 1), r"angular at n=1 is malformed in this evidence file$"),
        ((files["other"], "angular", 1), r"for a 30-layer model; this model has 5 layers$"),
    ]
    for (f, method, n), pattern in cases:
        argv = ["prune", stories_path, "--from", f, "--n", n, "--format", "mergekit", "--out", tmp_path / "o.yaml"]
        rc, _, se = cli(*argv, *(["--method", method] if method else []))
        assert rc == 2, (method, n, se)
        one_error_line(se, pattern)
        assert not (tmp_path / "o.yaml").exists()
