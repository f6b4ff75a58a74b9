"""bench/gpu_check.sh --small: the prepared GPU check runs on the CPU and prints sane JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def report():
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHON=sys.executable)  # this interpreter, not python3 from PATH
    p = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--small"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test_small_check_reports_every_figure(report):
    assert report["small"] is True and report["device"].startswith("cpu") and report["dtype"] == "float32"
    assert report["peak_flops"] is None  # no peak figure is claimed for a CPU
    assert report["shapes"]["pythia-410m"]["model_type"] == "gpt_neox"
    assert report["shapes"]["qwen3-8b"]["model_type"] == "qwen3"
    assert report["total_seconds"] > 0  # how long it takes is a benchmark (bench/gpu_check.sh prints it), not a test
    assert 0 < report["peak_memory_gib"] < 16


def test_engine_agrees_with_plain_implementation(report):
    for name in ("pythia-410m", "qwen3-8b"):
        rc = report["reference_check"][name]
        assert len(rc["pairs"]) >= 2 and rc["prompts"] >= 1
        # float32 on the CPU: the engine equals the plain implementation to rounding
        assert rc["max_abs_diff_nats"] < 1e-5 < rc["min_kl_nats"]
        assert rc["speed_ratio"] > 0 and rc["engine_s"] > 0 and rc["reference_s"] > 0


def test_sweeps_ran_the_right_pair_sets(report):
    py = report["pythia_410m_all_pairs"]
    assert py["pairs"] == 6 * 5 // 2 and py["tokens"] == 32 and py["prompts"] == 8
    q = report["qwen3_8b_gap3"]
    assert q["pairs"] == 3 * 6 - 6  # |i-j| <= 3 on 6 layers
    for r in (py, q):
        assert r["all_finite"] and r["kl_mean_nats"] > 0
        # prefix reuse + shared branch run fewer block evaluations than 1 + 3|S| full forwards
        assert 0 < r["block_calls"] < r["naive_block_calls"]
        assert r["block_tflops_run"] > 0 and r["fraction_of_peak"] is None
        assert r["oom_retries"] == [] and r["limits"]["max_rows"] >= 1
    assert q["target_prompts"] == 40 and q["measured_prompts"] <= 40
    assert q["extrapolated"] == (q["measured_prompts"] != 40)
    ratio = q["seconds_at_target_prompts"] / q["seconds_measured"]
    assert abs(ratio - 40 / q["measured_prompts"]) < 1e-9
