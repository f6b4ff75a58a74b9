"""Prefix sharing (swapkl.measure.prefix): a variant that starts from the base model's stored hidden states entering
its first removed layer gives bit-identical logits to its plain pruned copy, on every supported family (GPT-2 with
the inverse-layer-index scaling included), for recorded and unrecorded batches alike; and through lm-eval on
stories260K and the fixture task, task_accuracy with sharing equals the plain path exactly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import FAMILY_NAMES, tiny_model

ROOT = Path(__file__).resolve().parents[2]
TASK = "tinystories_mc"
SETS = ([1], [2], [1, 3], [2, 3], [0, 2], [3])


def _logits(model, x):
    """What lm-eval's HFLM calls: ``model(inps).logits`` (right padding, no attention mask)."""
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("kind", FAMILY_NAMES + ("gpt2-scaled",))
def test_shared_prefix_logits_equal_the_plain_copy(kind):
    from swapkl.measure.prefix import PrefixStore
    from swapkl.surgery.blocks import pruned_copy

    model = tiny_model(kind.split("-")[0], num_layers=5)
    if kind == "gpt2-scaled":  # GPT-2's attention scaled by 1 / (layer_idx + 1): the slots must be right
        model.config.scale_attn_by_inverse_layer_idx = True
        model = _rebuilt(model)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(1, 96, (3, 17), generator=g), torch.randint(1, 96, (2, 9), generator=g)]
    unseen = torch.randint(1, 96, (3, 17), generator=g)
    store = PrefixStore([min(s) for s in SETS])
    assert store.layers == [1, 2, 3]
    base = store.recording(model)
    for x in batches:
        assert torch.equal(_logits(base, x), _logits(model, x))
    assert store.stats["recorded_batches"] == 2
    for s in SETS:
        pm = pruned_copy(model, s)
        shared = store.attach(pm, s)
        assert shared == (min(s) > 0)
        for x in batches + [unseen]:
            assert torch.equal(_logits(pm, x), _logits(pruned_copy(model, s), x)), (kind, s)
    n_shared = sum(min(s) > 0 for s in SETS)
    assert store.stats["shared_batches"] == 2 * n_shared and store.stats["full_batches"] == n_shared
    from swapkl.model import architectures as arch

    assert all("forward" not in vars(b) for b in arch.locate(model).blocks)  # the caller's blocks untouched


def _rebuilt(model):
    """The same weights in a model built from ``model.config`` (after a config change)."""
    new = type(model)(model.config).eval()
    new.load_state_dict(model.state_dict())
    return new


def test_budget_bounds_the_stored_states():
    from swapkl.measure.prefix import PrefixStore
    from swapkl.surgery.blocks import pruned_copy

    model = tiny_model("llama", num_layers=5)
    x1, x2 = torch.randint(1, 96, (2, 8)), torch.randint(1, 96, (2, 8))
    store = PrefixStore([2], budget_bytes=2 * 8 * 32 * 4)  # exactly one batch's state entering layer 2
    base = store.recording(model)
    _logits(base, x1)
    _logits(base, x2)
    assert store.stats["recorded_batches"] == 1 and store.stats["unrecorded_batches"] == 1
    assert store.bytes == 2 * 8 * 32 * 4
    pm = pruned_copy(model, [2, 4])
    store.attach(pm, [2, 4])
    for x in (x1, x2):
        assert torch.equal(_logits(pm, x), _logits(pruned_copy(model, [2, 4]), x))
    assert (store.stats["shared_batches"], store.stats["full_batches"]) == (1, 1)


def test_task_accuracy_with_sharing_equals_the_plain_path(stories, tmp_path, monkeypatch):
    """Through lm-eval itself: the same metrics and stderrs, every variant's batches served from the store."""
    from swapkl.removal.methods import MethodOutput
    from swapkl.removal.plan import RemovalPlan
    from swapkl.measure.task_runner import TaskSettings
    from swapkl.removal.tasks import task_accuracy

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    sets = {"a": MethodOutput(sets=[[2], [2, 3]]), "b": MethodOutput(sets=[[1], [1, 4]]),
            "c": MethodOutput(sets=[[0], [0, 3]])}
    kw = dict(include_path=str(ROOT / "tests" / "fixtures" / "tasks"), limit=16, batch_size=8, use_cache=False)
    plan = RemovalPlan(2, ("random",))  # the sets are given: the plan's methods choose nothing here
    shared = task_accuracy(stories.model, stories.tokenizer, None, plan, TaskSettings((TASK,), **kw), sets=sets)
    plain = task_accuracy(stories.model, stories.tokenizer, None, plan, TaskSettings((TASK,), share_prefix=False, **kw),
                          sets=sets)
    assert json.dumps([shared.base, shared.methods], sort_keys=True) == \
        json.dumps([plain.base, plain.methods], sort_keys=True)
    st = shared.stats["prefix"]
    assert st["layers"] == [1, 2] and st["recorded_batches"] > 0 and st["unrecorded_batches"] == 0
    # 4 variants start at layer 1 or 2 (every batch shared); 2 start at layer 0 (nothing to share)
    assert st["shared_batches"] == 4 * st["recorded_batches"] and st["full_batches"] == 0
    assert "prefix" not in plain.stats


def test_cached_base_runs_again_when_two_new_variants_share_its_states(stories, tmp_path, monkeypatch):
    """The base's rows come from the cache, but two variants to evaluate start past layer 0: the base runs (to record
    its states) and every number equals a plain run without cache; with one new variant it is not worth it."""
    from swapkl.removal.methods import MethodOutput
    from swapkl.removal.plan import RemovalPlan, RunHooks
    from swapkl.measure.task_runner import TaskSettings
    from swapkl.removal.tasks import task_accuracy

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    kw = dict(include_path=str(ROOT / "tests" / "fixtures" / "tasks"), limit=16, batch_size=8)

    def run(sets, **more):
        return task_accuracy(stories.model, stories.tokenizer, None, RemovalPlan(2, ("random",)),
                             TaskSettings((TASK,), **kw, **more), RunHooks(identity=dict(stories.identity)), sets=sets)

    first = run({"a": MethodOutput(sets=[[2]])})
    assert first.stats["evaluations"] == 2
    one_new = run({"a": MethodOutput(sets=[[2], [2, 3]])})
    assert one_new.stats["evaluations"] == 1 and one_new.stats["prefix"]["recorded_batches"] == 0
    two_new = run({"a": MethodOutput(sets=[[2], [2, 4]]), "b": MethodOutput(sets=[[1]])})
    st = two_new.stats
    assert st["evaluations"] == 3 and st["cache_hits"] == 1  # the base again, [2, 4] and [1]; [2] from the cache
    assert st["prefix"]["recorded_batches"] > 0 and st["prefix"]["full_batches"] == 0
    assert st["prefix"]["shared_batches"] == 2 * st["prefix"]["recorded_batches"]
    plain = run({"a": MethodOutput(sets=[[2], [2, 4]]), "b": MethodOutput(sets=[[1]])}, use_cache=False,
                share_prefix=False)
    assert json.dumps([two_new.base, two_new.methods], sort_keys=True) == \
        json.dumps([plain.base, plain.methods], sort_keys=True)
