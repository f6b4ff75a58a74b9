"""The CLI: the documented JSON, and one-line errors with a non-zero exit on bad input.

The commands run in process (``support.cli_run``); the first run of ``test_preset_and_explicit_flags`` is a real
``python -m swapkl`` subprocess: the entry point, and a quiet run's empty stdout and stderr in a fresh interpreter
(nothing printed at import)."""
from __future__ import annotations

import json

import pytest

from support.cli_run import run_cli


def test_score_json(stories_path, tmp_path):
    out = tmp_path / "s.json"
    r = run_cli("score", str(stories_path), "--pairs", "gap:2", "--prompts", "4", "--tokens", "16",
                "--json", str(out), env_extra={"SWAPKL_CACHE": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    L = d["num_layers"]
    assert L == 5 and len(d["pairs"]) == 7 and all(i < j for i, j in d["pairs"])
    assert len(d["replacement_directed"]) == L and len(d["prompt_token_ids"]) == 4
    assert len(d["prompt_token_ids"][0]) == 16
    for i in range(L):
        for j in range(L):
            rd, r2, it = d["replacement_directed"][i][j], d["replacement"][i][j], d["interchange"][i][j]
            computed = (min(i, j), max(i, j)) in {tuple(p) for p in d["pairs"]}
            assert (rd is not None) == computed and (it is not None) == computed
            if computed:
                assert r2 == max(rd, d["replacement_directed"][j][i]) and it == d["interchange"][j][i]
    assert d["contract"]["pairs"] == "gap:2" and d["contract"]["positions"] == "all"
    assert d["contract"]["dtype"] == "float32" and d["model"]["kind"] == "local"


@pytest.mark.parametrize("args,msg", [
    (["score", "/nonexistent/model"], "no such file or folder"),
    (["score", "swapkl-test/no-such-model"], "cannot load 'swapkl-test/no-such-model'"),
    (["score", "STORIES", "--pairs", "gap:0"], "K must be at least 1"),
    (["score", "STORIES", "--prompts", "100000"], "too short"),
])
def test_bad_input_one_line(stories_path, tmp_path, args, msg):
    args = [str(stories_path) if a == "STORIES" else a for a in args]
    r = run_cli(*args, env_extra={"SWAPKL_CACHE": str(tmp_path / "c")})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and msg in lines[-1], r.stderr


def test_unsupported_architecture_cli(tmp_path):
    from swapkl.model.tiny import tiny_model

    # the hierarchical reasoning model runs its block lists in loops: refused in one line
    tiny_model("hrm_text").save_pretrained(tmp_path / "hrm")
    r = run_cli("score", str(tmp_path / "hrm"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unsupported architecture: hrm_text; supported:" in r.stderr


def test_preset_and_explicit_flags(stories_path, tmp_path):
    env = {"SWAPKL_CACHE": str(tmp_path / "c")}
    base = ["score", str(stories_path), "--prompts", "2", "--tokens", "8", "--quiet", "--json"]
    r = run_cli(*base, str(tmp_path / "a.json"), "--preset", "paper-last-token", env_extra=env, process=True)
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == ""
    assert json.loads((tmp_path / "a.json").read_text())["contract"]["positions"] == "last"
    r = run_cli(*base, str(tmp_path / "b.json"), "--preset", "paper-last-token", "--positions", "all", env_extra=env)
    assert json.loads((tmp_path / "b.json").read_text())["contract"]["positions"] == "all"
