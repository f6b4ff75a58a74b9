"""``task_accuracy`` with ``repair="bridge"``: each method's sets also evaluated by lm-eval with their bridges in
place, equal to lm-eval on a plain bridged model (deep copy, bridge fitted by a plain ``numpy.linalg.lstsq`` on the same
calibration activations); the raw numbers unchanged; the progress total exact."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from support.bridge_plain import plain_bridged
from swapkl.model import architectures as arch
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.scoring.corpora import from_file

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TASKS = ROOT / "tests" / "fixtures" / "tasks"
TASK = "tinystories_mc"
LIMIT = 40
BRIDGE = {"calib_tokens": 1024, "calib_window": 64, "ridge": 0.0}


def _sym(L, vals):
    d = np.full((L, L), np.nan)
    for i, v in enumerate(vals):
        d[i, i + 1] = d[i + 1, i] = v
    return d


def _folded_w(model, calib, i, j):
    m = copy.deepcopy(model)
    loc = arch.locate(m)
    got: dict = {}
    for s in (i, j):
        loc.blocks[s].register_forward_pre_hook(
            lambda mod, a, k, s=s: got.setdefault(s, []).append(a[0] if a else k["hidden_states"]), with_kwargs=True)
    arch.get_path(loc.blocks[i - 1], loc.family.mlp_out).register_forward_hook(
        lambda mod, a, o: got.setdefault("m", []).append(o))
    with torch.inference_mode():
        for row in calib:
            m(input_ids=row[None], use_cache=False)
    act = {k: torch.cat(v, 0).reshape(-1, v[0].shape[-1]).double().numpy() for k, v in got.items()}
    return np.linalg.lstsq(act["m"], act[j] - act[i] + act["m"], rcond=None)[0]


@pytest.mark.slow(reason="three lm-eval runs of 40 documents and two task-accuracy runs (17 s alone, ~45 s on a loaded machine)")
def test_bridged_task_accuracy_equals_lm_eval_on_a_plain_bridged_model(stories, wikitext_path, tmp_path,
                                                                      monkeypatch):
    from swapkl.measure import lmeval
    from swapkl.repair.bridger import Bridger
    from swapkl.measure.task_runner import TaskSettings
    from swapkl.removal.tasks import task_accuracy

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)  # the fixture task's data path is relative to the checkout
    corpus = from_file(wikitext_path)
    scores = {"replacement": _sym(5, [0.9, 0.1, 0.5, 0.3])}  # replacement removes layer 1 first (tie with 2)
    plan = RemovalPlan(1, ["replacement"], repair="bridge", bridge=BRIDGE)
    settings = TaskSettings((TASK,), include_path=str(FIXTURE_TASKS), limit=LIMIT, use_cache=False)
    ticks = []
    r = task_accuracy(stories.model, stories.tokenizer, scores, plan, settings,
                      RunHooks(corpus=corpus, progress=lambda d, t, m: ticks.append((d, t))))
    raw = task_accuracy(stories.model, stories.tokenizer, scores, plan.with_(repair="none", bridge={}), settings,
                        RunHooks(corpus=corpus))
    assert r.methods == raw.methods and raw.repaired == {}
    assert [e["removed"] for e in r.repaired["replacement"]] == [[1]] and r.repair["kind"] == "bridge"
    assert ticks[-1] == (3, 3)  # base, the raw set, the bridged set
    calib = Bridger(stories.model, stories.tokenizer, corpus, BRIDGE).calib.ids
    model = plain_bridged(stories.model, {(1, 2): _folded_w(stories.model, calib, 1, 2)}, "folded")
    model.config.use_cache = False  # the plain copy keeps its blocks' old layer indices: no KV cache
    tm = lmeval.task_manager(str(FIXTURE_TASKS))
    want = lmeval.evaluate(model, copy.deepcopy(stories.tokenizer), lmeval.load_task(tm, TASK), tm, limit=LIMIT)
    from swapkl.schema.tasks import tasks_fields

    checked = tasks_fields(r.to_dict())  # the file's validator takes the two new fields
    assert checked["repaired"]["replacement"][0]["removed"] == [1] and checked["repair"]["kind"] == "bridge"
    got = r.repaired["replacement"][0]
    for metric in ("acc,none", "acc_norm,none"):
        assert got["metrics"][TASK][metric] == pytest.approx(want["metrics"][TASK][metric])
