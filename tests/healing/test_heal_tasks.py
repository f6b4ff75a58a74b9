"""Task accuracy after healing (swapkl.healing.tasks, ``swapkl heal --tasks``): the healed model evaluated is the
model whose perplexity the heal reports (equal logits and PPL), its metrics equal a plain ``lm_eval.simple_evaluate``
on an HFLM around the merged healed model, zero training steps give exactly the pruned model's (and the base's)
metrics, a second call evaluates nothing (the tasks cache, adapters from the heal cache), the figure's dashed traces
are the JSON's numbers, and the report section and the CLI carry them.  stories260K, the local fixture task
(tests/fixtures/tasks/tinystories_mc), 8 documents, 3 training steps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.measure.task_runner import TaskSettings
from test_heal_curves import fake_scores
from test_tasks import counting_loads
from support.tensors import logits
from support.local_task import write_lastword_task
from support.app_util import heal_panel_app

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TASKS = ROOT / "tests" / "fixtures" / "tasks"
TASK = "tinystories_mc"
LIMIT = 8
EV = Evaluator("tiny", 300, 128, 64)
TINY = Recipe(steps=3, rank=2, seq_len=32, batch=2, lr=1e-2, warmup=1, checkpoint_every=2)
M = "acc,none"


def _curves(stories, corpus, recipe, shared=None):
    from swapkl.healing.heal import HealSetup
    from swapkl.healing.multi import heal_curves

    return heal_curves(stories.model, stories.tokenizer, fake_scores(), RemovalPlan(2, ("interchange",), spacing=0, evaluator=EV),
                       [1, 2], recipe, HealSetup(corpus=corpus, identity=stories.identity), shared=shared)


def _tasks(stories, hc, recipe, **kw):
    from swapkl.healing.tasks import heal_task_accuracy

    settings = TaskSettings((TASK,), include_path=str(FIXTURE_TASKS), limit=LIMIT)
    return heal_task_accuracy(stories.model, stories.tokenizer, hc, settings, recipe,
                              hooks=RunHooks(identity=stories.identity), **kw)


@pytest.fixture(scope="module")
def run(tasks_env, stories, small_corpus):
    shared: dict = {}
    hc = _curves(stories, small_corpus, TINY, shared)
    ht = _tasks(stories, hc, TINY, adapters=shared["adapters"])
    return hc, ht


def test_shape_contract_and_counts(run):
    hc, ht = run
    assert ht["format"] == "swapkl.heal_tasks/1"
    assert [e["n"] for e in ht["methods"]["interchange"]] == [1, 2]
    assert [e["removed"] for e in ht["methods"]["interchange"]] == [e["removed"] for e in hc.methods["interchange"]]
    for e in ht["methods"]["interchange"]:
        for role in ("pruned", "healed"):
            assert set(e[role]["metrics"][TASK]) == {"acc,none", "acc_norm,none"}
            assert all(v is not None for v in e[role]["stderr"][TASK].values())
    c = ht["contract"]
    assert c["limit"] == LIMIT and c["recipe_key"] == TINY.key() and c["recipe_line"] == TINY.describe()
    assert c["tasks"][TASK]["versions"][TASK] == 1.0 and c["n-samples"][TASK]["effective"] == LIMIT
    # base, control, 2 pruned, 2 healed: six models, each evaluated once (a fresh cache)
    assert ht["stats"]["evaluations"] == 6 and ht["stats"]["cache_hits"] == 0


def test_pruned_and_base_rows_are_the_swapkl_tasks_cache_entries(run, stories):
    """The base and pruned models are stored under exactly the keys ``swapkl tasks`` reads (removal.tasks' runner
    with no merge), so either command reuses the other's evaluations."""
    from swapkl.measure import lmeval
    from swapkl.measure.task_runner import TaskRunner as _Runner

    _, ht = run
    _, [task] = lmeval.load_tasks(lmeval.check_include_path(FIXTURE_TASKS), [TASK])
    r = _Runner(None, None, [task], None, identity=stories.identity,
                settings=TaskSettings((), limit=LIMIT, num_fewshot=None, batch_size=16), hooks=RunHooks(), total=1)
    assert r._read(r._path([], None, task))["metrics"] == ht["base"]["metrics"]
    for e in ht["methods"]["interchange"]:
        assert r._read(r._path(e["removed"], None, task))["metrics"] == e["pruned"]["metrics"]


def test_healed_model_is_the_heals_model_and_equals_plain_lm_eval(run, stories, small_corpus):
    """The model the runner evaluates has the logits of the merged healed model built from the cached adapter, the
    PPL the heal reported, and lm-eval's own simple_evaluate on an HFLM around it gives the same metrics."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from swapkl.healing import train as TR
    from swapkl.healing.tasks import _HealRunner, heal_tag
    from swapkl.measure import evaluate as E

    hc, ht = run
    entry, got = hc.methods["interchange"][1], ht["methods"]["interchange"][1]
    rem = entry["removed"]
    fp, tk = hc.contract["model_fingerprint"], hc.train_text["key"]
    _, state = TR.read_cached(TR.heal_dir(fp, rem, TINY, tk), TR.ADAPTER_KIND, TINY)
    merged = TR.healed_model(stories.model, rem, TINY, state)
    runner = _HealRunner(stories.model, stories.tokenizer, [], None, identity=None,
                         settings=TaskSettings((), limit=LIMIT, num_fewshot=None, batch_size=16, use_cache=False),
                         hooks=RunHooks(), total=1, states={",".join(map(str, rem)): state}, recipe=TINY)
    x = torch.randint(1, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    assert torch.equal(logits(runner._build(rem, heal_tag(hc)), x), logits(merged, x))
    ids = E.eval_ids(small_corpus, stories.tokenizer, EV)
    assert E.evaluate_ppl(merged, ids, EV.window, EV.stride, EV.drop_first_target).ppl == entry["ppl"]["healed"]
    lm = HFLM(pretrained=merged, tokenizer=stories.tokenizer, batch_size=16)
    plain = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(FIXTURE_TASKS)),
                                    limit=LIMIT, log_samples=False, verbosity="ERROR")["results"][TASK]
    for m in ("acc", "acc_norm"):
        assert got["healed"]["metrics"][TASK][f"{m},none"] == plain[f"{m},none"]
        assert got["healed"]["stderr"][TASK][f"{m},none"] == plain[f"{m}_stderr,none"]


def test_zero_steps_give_the_pruned_and_base_metrics_exactly(tasks_env, stories, small_corpus):
    zero = Recipe(steps=0, rank=2, seq_len=32, batch=2)
    shared: dict = {}
    hc = _curves(stories, small_corpus, zero, shared)
    ht = _tasks(stories, hc, zero, adapters=shared["adapters"])
    assert ht["base_finetuned"] == ht["base"]
    for e in ht["methods"]["interchange"]:
        assert e["healed"] == e["pruned"]


def test_second_call_evaluates_nothing(run, stories, monkeypatch):
    """Same curves, adapters now read from the heal cache, every model's rows from the tasks cache."""
    from swapkl.measure import lmeval

    hc, ht = run
    calls = []
    real = lmeval.evaluate
    monkeypatch.setattr(lmeval, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = _tasks(stories, hc, TINY)
    assert calls == [] and again["stats"]["evaluations"] == 0 and again["stats"]["cache_hits"] == 6
    assert {k: again[k] for k in ("base", "base_finetuned", "methods")} == \
        {k: ht[k] for k in ("base", "base_finetuned", "methods")}


def test_other_weights_or_recipe_are_refused(run, stories):
    from swapkl.errors import SwapklError

    hc, _ = run
    with pytest.raises(SwapklError, match="recipe"):
        _tasks(stories, hc, Recipe(steps=4, rank=2, seq_len=32, batch=2))
    from conftest import tiny_model

    with pytest.raises(SwapklError, match="fingerprint"):
        from swapkl.healing.tasks import adapter_states

        adapter_states(tiny_model("llama"), hc, TINY)


def test_figure_dashed_traces_are_the_json(run):
    from swapkl.healing.task_figures import heal_tasks_figure, heal_tasks_table

    _, ht = run
    entries = ht["methods"]["interchange"]
    for metric in ("acc,none", "acc_norm,none"):
        fig = heal_tasks_figure(ht, metric)
        healed = [t for t in fig.data if (t.meta or {}).get("kind") == "healed"]
        (ctrl,) = [t for t in fig.data if (t.meta or {}).get("kind") == "base_finetuned"]
        solid = [t for t in fig.data if (t.meta or {}).get("method") == "interchange" and "kind" not in t.meta]
        assert len(healed) == 1 and healed[0].line.dash == "dash" and len(solid) == 1
        assert list(healed[0].x) == [1, 2]
        assert list(healed[0].y) == [e["healed"]["metrics"][TASK][metric] for e in entries]
        assert list(healed[0].error_y.array) == [e["healed"]["stderr"][TASK][metric] for e in entries]
        assert list(ctrl.y) == [ht["base_finetuned"]["metrics"][TASK][metric]] * 2 and ctrl.line.dash == "dot"
        assert list(solid[0].y) == [ht["base"]["metrics"][TASK][metric]] + \
            [e["pruned"]["metrics"][TASK][metric] for e in entries]
        assert "healed: LoRA r2" in fig.layout.meta["contract"]
    table = heal_tasks_table(ht)
    assert list(table["model"][:2]) == ["base", "fine-tuned base (control)"]
    assert list(table[f"{TASK} {M} healed"][2:]) == [e["healed"]["metrics"][TASK][M] for e in entries]


def test_report_section_and_json_round_trip(run):
    from swapkl.healing.curves import HealCurves
    from swapkl.healing.figures import section

    hc, ht = run
    hc.tasks = ht
    back = HealCurves.from_dict(json.loads(hc.to_json()))
    assert back.tasks["methods"] == ht["methods"] and back.tasks["base_finetuned"] == ht["base_finetuned"]
    sec = section(back)
    assert len(sec.figures) == 3  # the ΔPPL figure, then acc and acc_norm with the dashed healed curves
    assert any("Task accuracy after healing" in b for b in sec.blocks)
    bad = dict(hc.to_dict(), tasks={"format": "swapkl.heal_tasks/1", "base": 3})
    from swapkl.errors import SwapklError

    with pytest.raises(SwapklError, match="tasks"):
        HealCurves.from_dict(bad)


def test_cli_heal_tasks(tasks_env, stories_path, small_corpus, tmp_path, capsys, monkeypatch):
    from swapkl.commands.cli import main

    text = tmp_path / "eval.txt"
    text.write_text(" ".join(small_corpus.words))
    js = tmp_path / "h.json"
    common = ["heal", str(stories_path), "--removed", "2", "--steps", "2", "--seq-len", "32", "--batch", "2",
              "--eval-text", str(text), "--max-words", "300"]
    for extra, pattern in ((["--limit", "3"], "--limit goes with --tasks"),
                           (["--tasks", "no_such_task_xyz", "--include-path", str(FIXTURE_TASKS)], "unknown lm-eval"),
                           (["--tasks", TASK, "--include-path", str(tmp_path / "nope")], "does not exist")):
        assert main(common + extra) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
        assert len(err) == 1 and pattern in err[0], err
    leak = tmp_path / "leak" / "heal_leak"  # a task built from the evaluation text: refused before the model loads
    write_lastword_task(leak.parent, "heal_leak", [{"context": " ".join(small_corpus.words[40:90]),
                                                   "target": small_corpus.words[90]}])
    assert main(common + ["--tasks", "heal_leak", "--include-path", str(tmp_path / "leak")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
    assert len(err) == 1 and "shares a 20-word passage with the run's held-out text" in err[0], err
    loads = counting_loads(monkeypatch)
    assert main(common + ["--tasks", TASK, "--include-path", str(FIXTURE_TASKS), "--limit", str(LIMIT),
                          "--json", str(js)]) == 0
    assert loads == [TASK]  # loaded once, before the model: the pruned, healed and base evaluations share it
    out = capsys.readouterr().out
    d = json.loads(js.read_text())
    (e,) = d["tasks"]["methods"]["given"]
    assert e["removed"] == [2] and e["n"] == 1
    assert f"before healing {e['pruned']['metrics'][TASK]['acc_norm,none']:.4f}" in out
    assert "healed: LoRA r8" in out
    from swapkl.healing.curves import HealCurves
    from swapkl.healing.figures import section

    one = HealCurves.from_dict(d)  # a one-set heal file keeps its tasks: the report section draws them
    assert one.tasks == d["tasks"] and len(section(one).figures) == 3


# --------------------------------------------------------------------------------------------- the dashboard
def test_demo_policy_bounds_heal_task_requests():
    from swapkl.jobs import HealRequest
    from swapkl.jobs.policy import Policy, PolicyError

    demo = Policy(demo=True, models=("default",), max_budget=4, tasks=("tinystories_mc",),
                  task_include_path="tests/fixtures/tasks", max_task_limit=100, max_fewshot=5)
    ok = dict(model="default", methods=("interchange",), ns=(1,), recipe=Recipe(steps=10, seq_len=64, batch=2),
              tasks=(TASK,), limit=50, include_path="tests/fixtures/tasks")
    demo.check_request(HealRequest(**ok))
    demo.check_request(HealRequest(**dict(ok, include_path=None)))
    bad = {"a task off the list": (dict(tasks=("hellaswag",)), "runs only these tasks"),
           "a browser's include path": (dict(include_path="/tmp/evil"), "never takes a task folder"),
           "an include path without tasks": (dict(tasks=(), include_path="/tmp/evil"), "no task chosen"),
           "no limit": (dict(limit=None), "at most 100 documents"),
           "a large limit": (dict(limit=10**6), "at most 100 documents"),
           "many shots": (dict(num_fewshot=50), "0 to 5 few-shot")}
    for why, (change, msg) in bad.items():
        with pytest.raises(PolicyError, match=msg):
            demo.check_request(HealRequest(**dict(ok, **change)))
            pytest.fail(why)
    plain = HealRequest(model="default", recipe=Recipe(steps=10))
    assert "tasks" not in plain.to_dict()  # requests without tasks keep their job keys
    assert HealRequest(**ok).to_dict()["tasks"] == [TASK]


def test_heal_job_with_tasks_runs_and_is_snapshotted(tasks_env, stories, stories_path):
    from swapkl.contract import Contract
    from swapkl.jobs import DONE, HealRequest, JobManager

    req = HealRequest(model=str(stories_path), contract=Contract(prompts=4, tokens=16), methods=("bi",), ns=(1,),
                      recipe=TINY, evaluator=EV, spacing=0, tasks=(TASK,), limit=LIMIT,
                      include_path=str(FIXTURE_TASKS))
    m = JobManager()
    try:
        job = m.submit(req)
        assert job.wait(600), job.summary()
        assert job.status == DONE, job.error
        p = job.progress()
        assert (p.step, p.steps) == (4, 4)
        ht = job.heal.tasks
        (e,) = ht["methods"]["bi"]
        assert e["removed"] == job.heal.methods["bi"][0]["removed"] and "healed" in e and ht["contract"]["limit"] == 8
    finally:
        m.shutdown()
    again = _tasks(stories, job.heal, TINY)  # the same numbers, from the caches
    assert again["stats"]["evaluations"] == 0 and again["methods"] == ht["methods"]
    m2 = JobManager(loader=lambda *a, **k: pytest.fail("a cached request must not load the model"))
    try:
        j2 = m2.submit(req)
        assert j2.status == DONE and j2.from_snapshot and j2.heal.tasks["methods"] == ht["methods"]
    finally:
        m2.shutdown()


def test_panel_draws_the_dashed_task_curves(run, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    hc, ht = run
    hc.tasks = ht
    f = tmp_path / "heal.json"
    hc.to_json(f)
    monkeypatch.setenv("SWAPKL_TEST_HEAL", str(f))
    at = AppTest.from_function(heal_panel_app, default_timeout=60).run()
    assert not at.exception, at.exception
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 2  # the ΔPPL figure, then the task figure
    healed = [t for t in charts[1]["data"] if (t.get("meta") or {}).get("kind") == "healed"]
    metric = charts[1]["layout"]["meta"]["metric"]
    assert healed and healed[0]["y"] == [e["healed"]["metrics"][TASK][metric] for e in ht["methods"]["interchange"]]
    assert healed[0]["line"]["dash"] == "dash"


def _demo_task_widgets_app():
    import streamlit as st

    from dashboard import tasks_panel
    from swapkl.jobs.policy import Policy

    pol = Policy(demo=True, tasks=("tinystories_mc",), task_include_path="tests/fixtures/tasks", max_task_limit=30)
    tasks, limit, shots, include = tasks_panel.task_widgets(pol, "w_heal_tasks")
    st.write(f"picked {tasks} {limit} {shots} {include}")


def test_demo_task_widgets_of_the_healing_panel_are_the_operators():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_demo_task_widgets_app, default_timeout=30).run()
    assert not at.exception, at.exception
    assert at.multiselect(key="w_heal_tasks_demo").options == ["tinystories_mc"]
    assert at.number_input(key="w_heal_tasks_limit_demo").max == 30
    assert not at.text_input  # no free-text task name or folder in demo mode
    assert "tests/fixtures/tasks" in at.markdown[0].value
