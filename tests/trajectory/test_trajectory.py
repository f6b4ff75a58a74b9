"""Trajectory statistics against hand-computed values, and the checkpoint-list parser."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from swapkl import trajectory as tr
from swapkl.scoring.results import SwapResult

NAN = float("nan")
PAIRS = [(0, 1), (1, 2), (2, 3)]


def sym(L, pairs, vals):
    m = np.full((L, L), np.nan)
    for (i, j), v in zip(pairs, vals):
        m[i, j] = m[j, i] = v
    return m


# step 0: d_repl [0.2, 0.4, 0.6], d_inter [0.1, 0.3, 0.2]
#   gaps [0.1, 0.1, 0.4]: mean 0.2, median 0.1, p75 0.1 + 0.5 * 0.3 = 0.25, max 0.4
#   ratios [0.5, 0.75, 1/3]: mean 0.527778, median 0.5; pearson 0.02 / (sqrt(0.08) sqrt(0.02)) = 0.5
# step 1000: d_repl [0.0, 0.5, 1.0], d_inter [0.05, 0.25, 1.5]
#   gaps [-0.05, 0.25, -0.5]: mean -0.1, median -0.05, p75 -0.05 + 0.5 * 0.3 = 0.1, max 0.25, 2 negative
#   ratios [NaN (d_repl = 0), 0.5, 1.5]: mean 1.0, median 1.0; pearson 0.725 / sqrt(0.5 * 1.235) = 0.922613
A = (0, sym(4, PAIRS, [0.2, 0.4, 0.6]), sym(4, PAIRS, [0.1, 0.3, 0.2]), PAIRS)
B = (1000, sym(4, PAIRS, [0.0, 0.5, 1.0]), sym(4, PAIRS, [0.05, 0.25, 1.5]), PAIRS)


def test_checkpoint_stats_hand_values():
    df = tr.checkpoint_stats([A, B])
    assert list(df["step"]) == [0, 1000] and list(df["pairs"]) == [3, 3] and list(df["num_layers"]) == [4, 4]
    a, b = df.iloc[0], df.iloc[1]
    assert a.gap_mean == pytest.approx(0.2) and a.gap_median == pytest.approx(0.1)
    assert a.gap_p75 == pytest.approx(0.25) and a.gap_max == pytest.approx(0.4) and a.negative_gaps == 0
    assert a.ratio_mean == pytest.approx((0.5 + 0.75 + 1 / 3) / 3) and a.ratio_median == pytest.approx(0.5)
    assert a.pearson == pytest.approx(0.5)
    assert a.d_repl_mean == pytest.approx(0.4) and a.d_inter_mean == pytest.approx(0.2)
    assert b.gap_mean == pytest.approx(-0.1) and b.gap_median == pytest.approx(-0.05)
    assert b.gap_p75 == pytest.approx(0.1) and b.gap_max == pytest.approx(0.25) and b.gap_min == pytest.approx(-0.5)
    assert b.negative_gaps == 2
    assert b.ratio_mean == pytest.approx(1.0) and b.ratio_median == pytest.approx(1.0)
    assert b.pearson == pytest.approx(0.725 / math.sqrt(0.5 * 1.235))


def test_gap_vs_depth_last_checkpoint():
    df = tr.gap_vs_depth([A, B])
    assert df[["i", "j"]].values.tolist() == [list(p) for p in PAIRS]
    assert df["depth"].tolist() == pytest.approx([0.5 / 3, 1.5 / 3, 2.5 / 3])
    assert df["gap"].tolist() == pytest.approx([-0.05, 0.25, -0.5])
    assert tr.gap_vs_depth([A, B], which=0)["gap"].tolist() == pytest.approx([0.1, 0.1, 0.4])
    # all pairs of a 3-layer model: depth spans [0.25, 0.75]
    allp = [(0, 1), (0, 2), (1, 2)]
    d = tr.gap_vs_depth((5, sym(3, allp, [1, 2, 3]), sym(3, allp, [0, 0, 0]), allp))
    assert d[["i", "j", "depth"]].values.tolist() == [[0, 1, 0.25], [0, 2, 0.5], [1, 2, 0.75]]


def test_pair_frame_and_input_forms():
    pf = tr.pair_frame([A, B])
    assert len(pf) == 6 and list(pf["checkpoint"]) == [0, 0, 0, 1, 1, 1]
    assert math.isnan(pf["ratio"].iloc[3]) and pf["ratio"].iloc[4] == pytest.approx(0.5)
    # pairs given as (j, i), dicts, TrajectoryPoint: same numbers
    rev = (0, A[1], A[2], [(1, 0), (2, 1), (3, 2)])
    d = {"step": 0, "d_repl": A[1].tolist(), "d_inter": A[2], "pairs": PAIRS, "label": "x"}
    for form in (rev, d, tr.TrajectoryPoint(*A)):
        assert tr.checkpoint_stats([form]).iloc[0].gap_p75 == pytest.approx(0.25)
    with pytest.raises(ValueError):
        tr.as_point((0, np.zeros((3, 3)), np.zeros((4, 4)), [(0, 1)]))
    with pytest.raises(ValueError):
        tr.as_point((0, np.zeros((3, 3)), np.zeros((3, 3)), [(0, 3)]))
    with pytest.raises(TypeError):
        tr.as_point("nope")


def test_nan_pairs_left_out_and_degenerate_cases():
    m_r = sym(4, PAIRS, [0.2, NAN, 0.6])
    m_i = sym(4, PAIRS, [0.1, 0.3, 0.2])
    s = tr.point_stats((7, m_r, m_i, PAIRS))
    assert s["pairs"] == 2 and s["gap_mean"] == pytest.approx((0.1 + 0.4) / 2)
    assert math.isnan(s["pearson"])  # fewer than 3 pairs
    empty = tr.point_stats((7, np.full((4, 4), np.nan), np.full((4, 4), np.nan), PAIRS))
    assert empty["pairs"] == 0 and math.isnan(empty["gap_mean"]) and math.isnan(empty["ratio_median"])
    const = tr.point_stats((7, sym(4, PAIRS, [0.3] * 3), sym(4, PAIRS, [0.1, 0.2, 0.3]), PAIRS))
    assert math.isnan(const["pearson"])


def _result(d_repl_dirs, d_inter, L=4, pairs=PAIRS):
    """A SwapResult whose per-prompt vectors have the given means (2 prompts each)."""
    vec = {}
    for (i, j), (rij, rji), di in zip(pairs, d_repl_dirs, d_inter):
        vec[(i, j)] = {"repl_ij": [rij - 0.01, rij + 0.01], "repl_ji": [rji, rji], "inter": [di, di]}
    return SwapResult.from_pair_vectors(L, vec, contract={"aggregation": "max"}, identity={})


def test_swap_results_agree_with_their_summary():
    res0 = _result([(0.2, 0.1), (0.1, 0.4), (0.6, 0.6)], [0.1, 0.3, 0.2])  # max of directions = step-0 values
    res1 = _result([(0.0, 0.0), (0.5, 0.2), (0.3, 1.0)], [0.05, 0.25, 1.5])
    df = tr.checkpoint_stats([(0, res0), (1000, res1)])
    ref = tr.checkpoint_stats([A, B])
    cols = ["gap_mean", "gap_median", "gap_p75", "gap_max", "ratio_mean", "ratio_median", "pearson"]
    np.testing.assert_allclose(df[cols].to_numpy(float), ref[cols].to_numpy(float), atol=1e-12)
    for row, res in zip(df.itertuples(), (res0, res1)):
        s = res.summary(ci=False)
        assert row.gap_mean == pytest.approx(s["gap"]["mean"]) and row.gap_p75 == pytest.approx(s["gap"]["p75"])
        assert row.ratio_median == pytest.approx(s["kl_ratio"]["median"])
        assert row.pearson == pytest.approx(s["pearson"])
    # a bare result list: steps are positions
    assert list(tr.checkpoint_stats([res0, res1])["step"]) == [0, 1]
    traj = tr.Trajectory(specs=[tr.CheckpointSpec("m", "step0", 0), tr.CheckpointSpec("m", "step1000", 1000)],
                         results=[res0, res1])
    js = json.loads(traj.to_json())
    assert [c["step"] for c in js["checkpoints"]] == [0, 1000]
    assert js["summary"][1]["gap_mean"] == pytest.approx(-0.1)
    assert [r["gap"] for r in js["gap_vs_depth"]] == pytest.approx([-0.05, 0.25, -0.5])


# ----------------------------------------------------------------------------------------- parsing

def _specs(specs):
    return [(s.spec, s.revision, s.step) for s in specs]


def test_parse_hub_lists():
    want = [("EleutherAI/pythia-410m", "step0", 0), ("EleutherAI/pythia-410m", "step1000", 1000),
            ("EleutherAI/pythia-410m", "step143000", 143000)]
    for text in ("EleutherAI/pythia-410m@step0, @step1000, @step143000",
                 "EleutherAI/pythia-410m@step0 @step1000\n@step143000",
                 "EleutherAI/pythia-410m step0 step1000 step143000",
                 "EleutherAI/pythia-410m@step0 step1000, step143000",
                 ["EleutherAI/pythia-410m@step0", "@step1000", "@step143000"]):
        assert _specs(tr.parse_checkpoints(text)) == want, text
    mixed = tr.parse_checkpoints("gpt2 distilgpt2 EleutherAI/pythia-70m@main @abc1234 default")
    assert _specs(mixed) == [("gpt2", None, None), ("distilgpt2", None, None),
                             ("EleutherAI/pythia-70m", "main", None), ("EleutherAI/pythia-70m", "abc1234", None),
                             ("default", None, None)]
    assert mixed[2].label == "EleutherAI/pythia-70m@main"


@pytest.mark.parametrize("bad, msg", [("@step0", "no model before it"), ("", "no checkpoints"),
                                      ("./nowhere/at/all", "no such"), ("m@", "empty revision"),
                                      ("missing.gguf", "no such")])
def test_parse_errors(bad, msg):
    with pytest.raises(tr.CheckpointListError, match=msg):
        tr.parse_checkpoints(bad)


def _model_dir(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_parse_local_folders(tmp_path):
    run = tmp_path / "run"
    for name in ("checkpoint-500", "checkpoint-20", "checkpoint-1000", "step3"):
        _model_dir(run / name)
    (run / "checkpoint-7").mkdir()  # no config.json: not a checkpoint
    (run / "logs").mkdir()
    specs = tr.parse_checkpoints(str(run))
    assert [(s.label, s.step) for s in specs] == [("step3", 3), ("checkpoint-20", 20), ("checkpoint-500", 500),
                                                  ("checkpoint-1000", 1000)]
    assert all(s.revision is None and s.spec.startswith(str(run.resolve())) for s in specs)
    # a manifest wins and gives the steps
    demo = tmp_path / "demo dir"  # a blank in the path
    for name in ("step0", "step10", "final"):
        _model_dir(demo / name)
    (demo / tr.MANIFEST).write_text(json.dumps({"checkpoints": [
        {"step": 0, "folder": "step0"}, {"step": 25, "folder": "final"}, {"step": 10, "folder": "step10"}]}))
    assert [(s.label, s.step) for s in tr.parse_checkpoints(str(demo))] == [("step0", 0), ("step10", 10),
                                                                            ("final", 25)]
    # a single model folder, mixed with a hub revision
    one = _model_dir(tmp_path / "global_step40")
    got = tr.parse_checkpoints([str(one), "EleutherAI/pythia-70m@step1"])
    assert _specs(got) == [(str(one.resolve()), None, 40), ("EleutherAI/pythia-70m", "step1", 1)]
    with pytest.raises(tr.CheckpointListError, match="holds no checkpoints"):
        tr.parse_checkpoints(str(run / "logs"))
    (demo / tr.MANIFEST).write_text("{broken")
    with pytest.raises(tr.CheckpointListError, match="cannot read"):
        tr.parse_checkpoints(str(demo))


def test_step_from_name():
    cases = {"step0": 0, "step143000": 143000, "global_step12": 12, "checkpoint-500": 500, "run/step_20": 20,
             "42": 42, "main": None, "abc1234": None, None: None, "my-step7": 7}
    for name, step in cases.items():
        assert tr.step_from_name(name) == step, name
