"""Every result type has ``to_dict`` / ``from_dict``, and the two are inverse through strict JSON."""
from __future__ import annotations

import json

import numpy as np
import pytest

from swapkl.scoring.score import score
from swapkl.contract import Contract
from swapkl.removal.curves import CurvesResult, removal_curves
from swapkl.errors import UploadError
from swapkl.measure.evaluate import Evaluator
from swapkl.measure.memo import EvalMemo
from swapkl.scoring.results import SwapResult
from swapkl.trajectory.checkpoints import CheckpointSpec
from swapkl.trajectory.compute import Trajectory
from swapkl.removal.plan import RemovalPlan, RunHooks
def _through_json(d: dict) -> dict:
    return json.loads(json.dumps(d, allow_nan=False))


@pytest.fixture(scope="module")
def real(stories_path, tmp_path_factory):
    """A real result (stories260K, adjacent + gap:2 pairs) and its removal curves."""
    import os

    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.corpora import load_corpus

    old = os.environ.get("SWAPKL_CACHE")
    os.environ["SWAPKL_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        ck = load_checkpoint(str(stories_path))
        res = score(ck, Contract(pairs="gap:2", prompts=3, tokens=12))
        scores = {"replacement": res.replacement(), "interchange": res.interchange()}
        cv = removal_curves(ck.model, ck.tokenizer, scores, RemovalPlan(budget=2, methods=["replacement", "interchange", "random"], evaluator=Evaluator("tiny", 200, 128, 64)),
                            RunHooks(corpus=load_corpus(), memo=EvalMemo()))
    finally:
        if old is None:
            os.environ.pop("SWAPKL_CACHE", None)
        else:
            os.environ["SWAPKL_CACHE"] = old
    return res, cv


def test_swap_result_roundtrip(real):
    res, _ = real
    d = _through_json(res.to_dict())
    back = SwapResult.from_dict(d)
    assert back.pairs == res.pairs and back.num_layers == res.num_layers
    np.testing.assert_array_equal(back.replacement(), res.replacement())
    np.testing.assert_array_equal(back.interchange(), res.interchange())
    assert _through_json(back.to_dict()) == d
    with pytest.raises(UploadError):
        SwapResult.from_dict({**d, "num_layers": -3})


def test_curves_result_roundtrip(real):
    _, cv = real
    d = _through_json(cv.to_dict())
    back = CurvesResult.from_dict(d)
    assert back.to_dict() == d
    assert back.methods["replacement"][1]["removed"] == cv.methods["replacement"][1]["removed"]
    assert back.baseline_ppl == cv.baseline_ppl and back.methods["random"][0]["n_seeds"] == 5
    # to_json is the same dict as text, from_json its inverse
    assert json.loads(cv.to_json()) == d and CurvesResult.from_json(cv.to_json()).to_dict() == d
    with pytest.raises(UploadError):
        CurvesResult.from_dict({**d, "baseline_ppl": "high"})


def test_trajectory_roundtrip(real):
    res, _ = real
    other = SwapResult.from_dict(_through_json(res.to_dict()))
    traj = Trajectory(specs=[CheckpointSpec("m", "step0", 0), CheckpointSpec("m", "step1000", 1000, "late")],
                      results=[res, other], contract={"pairs": "gap:2"})
    d = _through_json(traj.to_dict())
    back = Trajectory.from_dict(d)
    assert back.specs == traj.specs and back.contract == traj.contract
    assert _through_json(back.to_dict()) == d
    assert list(back.summary()["step"]) == [0, 1000]
    # a trajectory still running: fewer results than checkpoints is fine, more is not
    part = Trajectory.from_dict({**d, "results": d["results"][:1]})
    assert len(part.results) == 1 and len(part.specs) == 2
    for bad in ({**d, "results": d["results"] * 2}, {**d, "checkpoints": [{"step": 0}, {"step": 1}]}, [], None):
        with pytest.raises(UploadError):
            Trajectory.from_dict(bad)
