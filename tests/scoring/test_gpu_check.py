"""tests/gpu/gpu_check.sh --smoke: the GPU acceptance script runs every stage on tiny shapes on the CPU and reports
values that can be checked (correctness against the committed float64 result, equalities, FLOP predictions);
no wall-clock figure is asserted.  And the committed expected result is reproducible."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import gpu_models as gm

STAGES = ["env", "correctness", "pythia", "oom", "device_map", "torchrun", "scaling", "qwen", "study"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "smoke.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHON=sys.executable)  # this interpreter
    env.pop("OUT", None)
    p = subprocess.run(["bash", str(ROOT / "tests" / "gpu" / "gpu_check.sh"), "--smoke", "--out", str(out),
                        "--budget-s", "100000"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    written = json.loads(out.read_text())
    assert json.loads(p.stdout) == written  # the same JSON on stdout at the end
    return written


def test_every_stage_ran_and_passed(smoke):
    assert smoke["smoke"] is True and smoke["complete"] is True and smoke["device"] == "cpu"
    assert list(smoke["stages"]) == STAGES
    failed = {k: v.get("error") or v for k, v in smoke["stages"].items() if v.get("pass") is not True}
    assert not failed, failed
    assert smoke["all_pass"] is True
    assert [r["stage"] for r in smoke["table"]] == STAGES
    for row in smoke["table"]:
        assert row["pass"] is True and row["seconds"] > 0 and row["peak_memory_gib"] > 0


def test_env_reports_versions_and_measured_ceilings(smoke):
    env = smoke["stages"]["env"]
    assert env["torch"] == torch.__version__ and env["transformers"] and env["swapkl"]
    assert env["bf16_gemm_tflops"] > 0 and env["copy_gb_per_s"] > 0 and env["bf16_gemm_shape"] == [256] * 3


def test_correctness_against_the_committed_float64_result(smoke):
    c = smoke["stages"]["correctness"]
    assert c["weights_reproduced"] is True and c["pairs"] == [list(p) for p in [(0, 1), (1, 2), (2, 3), (0, 2),
                                                                                 (1, 3), (0, 3)]]
    f32, plain, bf16 = (c["cases"][k] for k in ("float32, fused KL", "float32, plain KL", "bfloat16, fused KL"))
    for case in (f32, plain):  # float32 on a CPU: within 1e-4 relative of float64 (in fact ~1e-6)
        assert case["pass"] and case["max_rel_diff"] <= 1e-4 and case["smallest_expected_kl"] > 0.1
    assert f32["kl"]["used"] == "chunked" and plain["kl"]["used"] == "plain"
    assert bf16["pass"] and 0 < bf16["precision_floor_nats"] < 0.01
    assert bf16["max_rel_diff"] > f32["max_rel_diff"]  # bf16 really ran in bf16


def test_pythia_stage_counts_flops_time_and_memory(smoke):
    p = smoke["stages"]["pythia"]
    fused, plain = p["fused"], p["unfused"]
    assert fused["pairs"] == 15 and fused["prompts"] == 8 and fused["tokens"] == 32  # all pairs of 6 layers
    assert fused["kl"]["used"] == "chunked" and plain["kl"]["used"] == "plain"
    assert p["fused_vs_unfused_max_rel_diff"] == 0.0  # chunked and plain: the same bits
    for r in (fused, plain):
        assert r["tflop_head"] > 0 and r["tflop_blocks"] > 0 and 0 < r["share_of_peak"]
        assert 0 < r["kl_seconds"] <= r["head_kl_seconds"] < r["seconds"]
        assert r["estimate_bounds_peak"] and 0 < r["peak_memory_gib"] <= r["estimated_memory_gib"]
    # FLOPs spent: the engine's block runs (baseline + sweep) are exactly the predicted ones
    assert fused["block_runs"] == gm.predicted_block_runs([tuple(x) for x in _all(6)], 6, 8) + 8 * 6
    assert set(p["targets"]) == {"seconds<=10", "share_of_peak>=0.5", "kl_speedup>=2"}


def _all(L):
    from swapkl.contract import pair_list

    return pair_list("all", L)


def test_scaling_predicts_the_block_runs_exactly(smoke):
    s = smoke["stages"]["scaling"]
    assert [(q["pairs"], q["prompts"]) for q in s["points"]] == [("adjacent", 8), ("gap:3", 8), ("all", 2),
                                                                 ("all", 4), ("all", 8)]
    assert all(q["predicted_block_runs"] == q["block_runs"] for q in s["points"])
    assert math.isfinite(s["fit"]["r2"]) and s["fit"]["seconds_per_tflop"] != 0


def test_qwen_stage_measures_and_extrapolates_with_block_runs(smoke):
    q = smoke["stages"]["qwen"]
    assert q["pairs_total"] == 12 and q["measured_pairs"] == 4 and q["prompts"] == 40
    ratio = (q["seconds_all_extrapolated"] - q["baseline_s"]) / q["sweep_s"]
    assert ratio == pytest.approx(q["block_runs_all"] / q["block_runs_measured"], rel=1e-9)
    assert q["block_runs_all"] > q["block_runs_measured"] > 0
    assert q["peak_memory_gib"] <= q["estimated_memory_gib"]


def test_oom_device_map_and_torchrun_stages_compare_values(smoke):
    oom = smoke["stages"]["oom"]
    assert oom["simulated"] is True and oom["attempts"][-1]["retries"]
    assert oom["attempts"][-1]["max_rel_diff"] <= 1e-4
    dm = smoke["stages"]["device_map"]
    assert dm["max_abs_diff_nats"] <= 1e-5 < dm["smallest_kl"] and dm["layer_devices"] == ["cpu"] * 5
    tr = smoke["stages"]["torchrun"]
    assert tr["world"] == 2 and [r["rank"] for r in tr["ranks"]] == [0, 1]
    assert sum(r["pairs"] for r in tr["ranks"]) == 10 and tr["max_abs_diff_nats"] <= 1e-5


def test_the_study_stage_runs_the_study_on_the_device(smoke):
    st = smoke["stages"]["study"]
    assert st["pass"] is True and st["stories_max_rel_diff_vs_cpu"] == 0.0  # the CPU against itself
    assert [r["n"] for r in st["stories_rows"]] and st["paper_models_cached"] == []


def test_a_stage_that_does_not_fit_the_budget_is_skipped_and_said(tmp_path):
    out = tmp_path / "cut.json"
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "gpu_check.py"), "--smoke", "--out", str(out),
                        "--stages", "env,qwen", "--budget-s", "3"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["stages"]["env"]["pass"] is True
    assert "skipped" in d["stages"]["qwen"] and d["all_pass"] is False


def test_the_committed_expected_result_is_reproducible():
    """The smoke case of tests/gpu/gpu_check_expected.json, recomputed here (float64 reference on this CPU), equals the
    committed one: the weights and prompts come from a hash, not from a random generator."""
    committed = json.loads(gm.EXPECTED.read_text())
    assert set(committed) == {"smoke", "full"}
    for name in ("smoke", "full"):
        assert committed[name]["config"] == gm.CORRECTNESS[name]["config"]
    fresh = gm.make_expected(("smoke",))["smoke"]
    assert fresh["weights_checksum"] == pytest.approx(committed["smoke"]["weights_checksum"], rel=1e-12)
    for key, vecs in committed["smoke"]["kl"].items():
        for k, v in vecs.items():
            assert fresh["kl"][key][k] == pytest.approx(v, rel=1e-10, abs=1e-12)
    full = committed["full"]
    assert full["config"]["hidden_size"] == 1024 and full["config"]["vocab_size"] == 50304
    assert full["tokens"] == 128 and len(full["pairs"]) == 6
    assert min(x for v in full["kl"].values() for k in v.values() for x in k) > 0.01
