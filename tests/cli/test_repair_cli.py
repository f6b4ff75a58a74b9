"""CLI of removal with repair: ``curves --repair bridge`` prints raw and bridged ΔPPL % side by side with the paired
CI and its word (tie when the CI includes 0) and writes ``repaired``/``repair``; ``recommend --repair bridge`` the
same for its sets; bad repair flags are one line with exit code 2 before any model is loaded."""
from __future__ import annotations

import json
import re

import pytest

QUICK = ["--max-words", "200", "--prompts", "8", "--tokens", "64", "--calib-tokens", "1024", "--calib-window", "64",
         "--device", "cpu"]
METHODS = ("replacement", "interchange", "bridge", "replaceme")


def _table(out: str) -> list[list[str]]:
    lines = out.splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("raw vs bridged"))
    rows = []
    for ln in lines[k + 2:]:
        if not ln.startswith("  "):
            break
        rows.append(ln)
    return rows


def _check_rows(rows, repaired):
    want = [(name, e) for name, es in repaired.items() for e in es]
    assert len(rows) == len(want)
    for ln, (name, e) in zip(rows, want):
        assert ln.split()[0] == name and f"{e['delta_pct']:+.1f}" in ln
        lo, hi = e["paired_ci"]
        assert f"{e['paired_delta_pct']:+.1f} [{lo:+.1f}, {hi:+.1f}]" in ln
        assert ln.split()[-1] == ("better" if hi < 0 else "worse" if lo > 0 else "tie")


def test_curves_repair_bridge_prints_both_columns(cli, stories_path, tmp_path):
    out_json = tmp_path / "c.json"
    rc, out, err = cli("curves", stories_path, "--budget", "2", "--repair", "bridge", "--methods", ",".join(METHODS),
                       "--json", out_json, *QUICK)
    assert rc == 0, err
    d = json.loads(out_json.read_text())
    assert set(d["repaired"]) == set(METHODS) and d["repair"]["kind"] == "bridge"
    assert d["plan"]["repair"] == "bridge" and d["plan"]["bridge"] == {"calib_tokens": 1024, "calib_window": 64}
    assert d["repair"]["settings"]["calib_tokens"] == 1024
    assert re.search(r"raw ΔPPL %\s+bridged ΔPPL %\s+bridged − raw \[CI\]", out)
    _check_rows(_table(out), d["repaired"])


@pytest.mark.parametrize("args,message", [
    (["--repair", "bridge", "--unit", "mlp"], "--repair bridge replaces whole blocks"),
    (["--ridge", "0.1"], "--form, --calib-window, --calib-seed and --ridge go with --repair bridge"),
    (["--repair", "bridge", "--ridge", "-1"], "ridge must be a finite number >= 0"),
    (["--repair", "bridge", "--calib-tokens", "8"], "at least 16"),
])
def test_bad_repair_flags_are_one_line(cli, stories_path, args, message):
    rc, out, err = cli("curves", stories_path, "--budget", "1", "--methods", "replacement", *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in err


def test_recommend_repair_bridge(cli, stories_path, tmp_path):
    out_json = tmp_path / "r.json"
    rc, out, err = cli("recommend", stories_path, "--budget", "1", "--repair", "bridge", "--compare", "replacement",
                       "--json", out_json, *QUICK)
    assert rc == 0, err
    d = json.loads(out_json.read_text())
    assert set(d["repaired"]) == {"recommend", "replacement"} and d["repair"]["kind"] == "bridge"
    _check_rows(_table(out), d["repaired"])
