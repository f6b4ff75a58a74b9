"""CLI: ``prune`` writes a folder that reloads identically; ``curves`` writes the documented JSON; bad input is
one line with exit code 2."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from swapkl.commands.cli import main


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def err_line(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [ln for ln in err.splitlines() if ln.strip()][-1]


def test_prune_cli(stories_path, tmp_path, capsys):
    import transformers as tf

    out = tmp_path / "pruned"
    assert main(["prune", str(stories_path), "--remove", "1,3", "--out", str(out), "--device", "cpu",
                 "--verify"]) == 0
    text = capsys.readouterr().out
    assert "removed layers [1, 3], 3 of 5 kept" in text and "verified" in text
    rec = json.loads((out / "swapkl_prune.json").read_text())
    assert rec["removed"] == [1, 3] and rec["source"]["kind"] == "local" and rec["source"]["fingerprint"]
    model = tf.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 3
    assert tf.AutoTokenizer.from_pretrained(out) is not None


@pytest.mark.parametrize("remove,msg", [("9", "out of range"), ("a,b", "comma-separated layer indices"),
                                        ("0,1,2,3,4", "cannot remove all")])
def test_prune_cli_bad(stories_path, tmp_path, capsys, remove, msg):
    assert main(["prune", str(stories_path), "--remove", remove, "--out", str(tmp_path / "x")]) == 2
    line = err_line(capsys)
    assert line.startswith("error: ") and msg in line


def _score_json(stories_path, tmp_path):
    path = tmp_path / "scores.json"
    assert main(["score", str(stories_path), "--prompts", "2", "--tokens", "16", "--json", str(path),
                 "--quiet", "--device", "cpu"]) == 0
    return path


def test_curves_cli_with_scores(stories_path, tmp_path, capsys):
    scores = _score_json(stories_path, tmp_path)
    out = tmp_path / "curves.json"
    rc = main(["curves", str(stories_path), "--budget", "2", "--scores", str(scores), "--methods",
               "replacement,interchange,random,bi,sleb", "--max-words", "300", "--calib-tokens", "256",
               "--device", "cpu", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "baseline PPL" in text and "regime" in text
    d = json.loads(out.read_text())
    assert d["baseline_ppl"] > 1 and d["evaluator"]["window"] == 512 and d["evaluator"]["max_words"] == 300
    assert set(d["methods"]) == {"replacement", "interchange", "random", "bi", "sleb"}
    for name, entries in d["methods"].items():
        for k, e in enumerate(entries):
            assert e["n"] == k + 1 and {"n", "removed", "ppl", "delta_pct"} <= set(e)
            assert e["delta_pct"] == pytest.approx(100 * (e["ppl"] / d["baseline_ppl"] - 1), rel=1e-9)
            if name != "random":
                assert len(e["removed"]) == k + 1
    assert len(d["methods"]["sleb"]) == 2 and len(d["random_seeds"]["random"]) == 5
    assert d["verdict"]["regime"] in ("divergent", "tied", "weak")
    assert d["model"]["kind"] == "local"


def test_curves_cli_computes_scores(stories_path, tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["curves", str(stories_path), "--budget", "1", "--methods", "replacement,interchange",
                 "--prompts", "2", "--tokens", "16", "--max-words", "300", "--device", "cpu", "--quiet",
                 "--no-kl", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["methods"]["replacement"][0]["kl_to_base"] is None and d["delta_ratio"][0]["n"] == 1
    assert d["notes"][0].startswith("scores computed")


def test_curves_cli_bad_input(stories_path, tmp_path, capsys):
    base = ["curves", str(stories_path), "--device", "cpu", "--max-words", "300"]
    L = 5
    plain = tmp_path / "plain.json"
    m = np.full((L, L), 0.2).tolist()
    plain.write_text(json.dumps({"replacement": m, "interchange": m}))
    # budget larger than the candidates allow under the spacing rule
    assert main(base + ["--budget", "3", "--scores", str(plain), "--methods", "replacement"]) == 2
    assert "at most 2 of 3 candidates" in err_line(capsys)
    # scores of a different model: layer count, then identity
    six = tmp_path / "six.json"
    six.write_text(json.dumps({"replacement": np.zeros((6, 6)).tolist(), "interchange": np.zeros((6, 6)).tolist()}))
    assert main(base + ["--budget", "1", "--scores", str(six)]) == 2
    assert "6-layer model; this model has 5" in err_line(capsys)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"replacement": m, "interchange": m,
                                 "model": {"id": "someone/else", "fingerprint": "0" * 16, "num_layers": 5}}))
    assert main(base + ["--budget", "1", "--scores", str(other)]) == 2
    assert "different model" in err_line(capsys)
    # empty and too-short evaluation text
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert main(base + ["--budget", "1", "--scores", str(plain), "--eval-text", str(empty)]) == 2
    assert "empty" in err_line(capsys)
    short = tmp_path / "short.txt"
    short.write_text("word " * 100)
    assert main(["curves", str(stories_path), "--budget", "1", "--scores", str(plain), "--eval-text", str(short),
                 "--device", "cpu"]) == 2
    assert "needs 5000" in err_line(capsys)
    assert main(base + ["--budget", "1", "--scores", str(plain), "--methods", "nope"]) == 2
    assert "unknown method nope; available:" in err_line(capsys)
    assert main(base + ["--budget", "1", "--scores", str(tmp_path / "missing.json")]) == 2
    assert "no such scores file" in err_line(capsys)
