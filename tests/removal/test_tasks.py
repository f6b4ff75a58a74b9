"""Task accuracy after removal (swapkl.removal.tasks, ``python -m swapkl tasks``): on stories260K and the local fixture
task (tests/fixtures/tasks/tinystories_mc), the numbers equal lm-eval's own CLI run on the exported pruned folder, a
second run evaluates nothing (the cache), the JSON has the documented shape, the removal sets are the curves
runner's, and hostile input is one ``error:`` line with exit code 2."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TASKS = ROOT / "tests" / "fixtures" / "tasks"
TASK = "tinystories_mc"
LIMIT = 40
COMMON = ["--tasks", TASK, "--include-path", str(FIXTURE_TASKS), "--limit", str(LIMIT), "--prompts", "4",
          "--tokens", "16", "--quiet"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tasks-cache")


def _main(args, cache: Path, monkeypatch) -> int:
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)  # the fixture's data file path is relative to the checkout (as for lm_eval's CLI)
    return main([str(a) for a in args])


#: the tasks the module's first run loaded, by name, in order
FIRST_RUN_LOADS: list = []


def counting_loads(mp) -> list:
    """Every ``lmeval.load_task(manager, name)`` call from now on, by name (the real loader still runs)."""
    from swapkl.measure import lmeval

    calls, real = [], lmeval.load_task

    def counted(tm, name):
        calls.append(name)
        return real(tm, name)
    mp.setattr(lmeval, "load_task", counted)
    return calls


@pytest.fixture(scope="module")
def first_run(stories_path, cache, tmp_path_factory):
    """One CLI run: bi and replacement, budget 2 (boundary layers allowed, no spacing), 40 documents (the names of
    the tasks it loaded go to :data:`FIRST_RUN_LOADS`)."""
    mp = pytest.MonkeyPatch()
    out = tmp_path_factory.mktemp("run1") / "tasks.json"
    try:
        loads = counting_loads(mp)
        rc = _main(["tasks", stories_path, "--methods", "bi,replacement", "--budget", "2", "--include-boundary",
                    "--spacing", "0", *COMMON, "--json", out], cache, mp)
    finally:
        mp.undo()
    assert rc == 0 and loads
    FIRST_RUN_LOADS[:] = loads
    return json.loads(out.read_text())


def test_each_task_is_loaded_once_per_run(first_run):
    """The command loads the tasks before the model (a bad name fails first) and the run uses what it loaded."""
    from swapkl.measure import lmeval

    assert FIRST_RUN_LOADS == [TASK] and not lmeval._HELD.tasks


def test_json_shape_and_contract(first_run):
    d = first_run
    assert set(d["methods"]) == {"bi", "replacement"}
    assert set(d["base"]) == {"metrics", "stderr", "docs"}
    assert set(d["base"]["metrics"]) == {TASK} and set(d["base"]["metrics"][TASK]) == {"acc,none", "acc_norm,none"}
    for entries in d["methods"].values():
        assert [e["n"] for e in entries] == [1, 2]
        for e in entries:
            assert {"n", "removed", "metrics", "stderr", "docs"} <= set(e)
            docs = e["docs"][TASK]
            assert docs["doc_id"] == list(range(LIMIT)) and docs["doc_sha"] == d["base"]["docs"][TASK]["doc_sha"]
            for metric, v in e["metrics"][TASK].items():  # the metric is the mean of its per-document scores
                assert set(docs[metric]) <= {0.0, 1.0} and sum(docs[metric]) / LIMIT == pytest.approx(v)
            assert len(e["removed"]) == e["n"] and all(0 <= i < 5 for i in e["removed"])
            for metric, v in e["metrics"][TASK].items():
                assert abs(v * LIMIT - round(v * LIMIT)) < 1e-9  # a fraction of the 40 documents
                p = v
                assert e["stderr"][TASK][metric] == pytest.approx((p * (1 - p) / (LIMIT - 1)) ** 0.5)
        assert set(entries[0]["removed"]) <= set(entries[1]["removed"])  # nested sets
    c = d["contract"]
    assert c["lm_eval_version"] == "0.4.13"
    assert c["tasks"][TASK]["versions"] == {TASK: 1.0}
    assert c["tasks"][TASK]["chance"] == pytest.approx(0.25)
    assert c["limit"] == LIMIT and c["n-samples"][TASK] == {"original": 200, "effective": LIMIT}
    assert c["n-shot"] == {TASK: 0}
    # stories260K knows its stories: well above chance (0.25) before removal
    assert d["base"]["metrics"][TASK]["acc,none"] >= 0.8
    assert d["stats"]["evaluations"] == d["stats"]["variants"] >= 3


def test_second_run_evaluates_nothing(first_run, stories_path, cache, tmp_path, monkeypatch):
    out = tmp_path / "again.json"
    assert _main(["tasks", stories_path, "--methods", "bi,replacement", "--budget", "2", "--include-boundary",
                  "--spacing", "0", *COMMON, "--json", out], cache, monkeypatch) == 0
    d = json.loads(out.read_text())
    assert d["stats"]["evaluations"] == 0
    assert d["stats"]["cache_hits"] == first_run["stats"]["variants"]
    assert d["base"] == first_run["base"] and d["methods"] == first_run["methods"]


def test_cache_key_names_each_part():
    """The cache file changes with the weights, removed set, task version and configuration, limit, few-shot count
    and lm-eval version: any of them changes the numbers."""
    from swapkl.removal.plan import RunHooks
    from swapkl.measure.task_runner import TaskRunner as _Runner, TaskSettings

    task = {"name": TASK, "versions": {TASK: 1.0}, "config_sha": "abc"}
    ident = {"kind": "local", "id": "/m", "fingerprint": "f0", "dtype": "float32"}

    def path(removed=(2,), task=task, ident=ident, limit=40, shots=None, version="0.4.13"):
        r = _Runner(None, None, [task], None, identity=ident,
                    settings=TaskSettings((), limit=limit, num_fewshot=shots, batch_size=16), hooks=RunHooks(), total=1)
        r.lm_eval_version = version
        return r._path(list(removed), None, task)

    base = path()
    assert base == path()
    variants = [path(removed=(3,)), path(task=dict(task, versions={TASK: 2.0})), path(task=dict(task, config_sha="x")),
                path(ident=dict(ident, fingerprint="f1")), path(limit=20), path(shots=5), path(version="0.4.12")]
    assert len({base, *variants}) == len(variants) + 1
    from swapkl.measure.task_runner import _cache_key
    assert _cache_key({"kind": "local", "id": "/m"}) is None  # weights not named: nothing cached


def test_equals_lm_eval_cli_on_the_exported_folder(first_run, stories, tmp_path):
    """The in-memory numbers of a pruned model equal ``lm_eval --model hf`` on the folder save_pruned writes."""
    from swapkl.surgery.prune import save_pruned

    entry = first_run["methods"]["bi"][0]
    ck = stories
    folder = save_pruned(ck.model, entry["removed"], tmp_path / "pruned", tokenizer=ck.tokenizer)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")
    r = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={folder}",
                        "--tasks", TASK, "--include_path", str(FIXTURE_TASKS), "--limit", str(LIMIT),
                        "--batch_size", "16", "--device", "cpu", "--output_path", str(tmp_path / "out")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    from swapkl.measure.lmeval import rows_of

    files = list((tmp_path / "out").rglob("results_*.json"))
    assert len(files) == 1
    cli = rows_of(json.loads(files[0].read_text()))
    for metric in ("acc,none", "acc_norm,none"):
        assert round(entry["metrics"][TASK][metric], 4) == round(cli["metrics"][TASK][metric], 4)
        assert round(entry["stderr"][TASK][metric], 4) == round(cli["stderr"][TASK][metric], 4)


def test_sets_are_the_curves_runner_sets(stories):
    """removal_sets gives every method the curves runner's context: the same sets for guided, evaluating (SLEB),
    calibration-based (BI) and seeded (random) methods."""
    import numpy as np

    from swapkl.removal.curves import removal_curves
    from swapkl.measure.evaluate import Evaluator
    from swapkl.measure.memo import EvalMemo
    from swapkl.removal.plan import RemovalPlan, RunHooks
    from swapkl.removal.tasks import removal_sets
    from swapkl.scoring.corpora import load_corpus

    model, tok = stories.model, stories.tokenizer
    rng = np.random.default_rng(0)
    d = rng.random((5, 5))
    scores = {"replacement": d + d.T, "interchange": (d + d.T)[::-1, ::-1].copy()}
    ev = Evaluator("tiny", 300, 64, 32)
    corpus = load_corpus("builtin")
    methods = ["replacement", "interchange", "bi", "sleb", "random"]
    params = {"sleb": {"calib_tokens": 128}, "bi": {"calib_tokens": 128}}
    plan = RemovalPlan(2, methods, spacing=0, exclude_boundary=False, seeds=range(5), evaluator=ev, kl=False,
                       method_params=params)
    curves = removal_curves(model, tok, scores, plan, RunHooks(corpus=corpus, memo=EvalMemo()))
    sets = removal_sets(model, tok, scores, plan, RunHooks(corpus=corpus, memo=EvalMemo()))
    for name in ("replacement", "interchange", "bi", "sleb"):
        assert [list(s) for s in sets[name].sets] == [e["removed"] for e in curves.methods[name]], name
    assert {str(k): [list(s) for s in v] for k, v in sets["random"].runs.items()} == \
        {k: [e["removed"] for e in v] for k, v in curves.random_seeds["random"].items()}


# ------------------------------------------------------------------------------------------------- hostile input
def _one_error(err: str, pattern: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize("args, pattern", [
    (["--tasks", "no_such_task_xyz", "--include-path", FIXTURE_TASKS, "--budget", "1"],
     r"unknown lm-eval task 'no_such_task_xyz'"),
    (["--tasks", TASK, "--include-path", "/no/such/dir", "--budget", "1"], r"--include-path /no/such/dir does not exist"),
    (["--tasks", TASK, "--include-path", ROOT / "README.md", "--budget", "1"], r"is not a folder of task YAML"),
    (["--tasks", TASK, "--include-path", ROOT / "docs", "--budget", "1"], r"holds no task YAML files"),
    (["--tasks", TASK, "--include-path", FIXTURE_TASKS, "--budget", "4"], r"budget 4 is larger than the candidate"),
    (["--tasks", TASK, "--include-path", FIXTURE_TASKS, "--budget", "0"], r"--budget must be at least 1"),
    (["--tasks", " , ", "--budget", "1"], r"--tasks names no task"),
    (["--tasks", TASK, "--include-path", FIXTURE_TASKS, "--budget", "1", "--limit", "0"], r"--limit must be at least 1"),
    (["--tasks", TASK, "--include-path", FIXTURE_TASKS, "--budget", "1", "--methods", "nope"], r"nope"),
    (["--tasks", "hellaswag", "--include-path", FIXTURE_TASKS, "--budget", "1"], r"lm-eval task 'hellaswag': its data is not available offline .*(Offline|reach|connect)"),
])
def test_hostile_tasks_cli(stories_path, tmp_path, capsys, monkeypatch, args, pattern):
    rc = _main(["tasks", stories_path, *args, "--prompts", "4", "--tokens", "16"], tmp_path / "c", monkeypatch)
    assert rc == 2
    _one_error(capsys.readouterr().err, pattern)
    assert not (tmp_path / "c" / "tasks").exists()


# ------------------------------------------------------------------------------------------------- dashboard backend
def test_demo_policy_bounds_task_requests():
    """Demo mode: allow-listed task names only (a YAML path in the name field is refused: lm-eval would load it and
    a task YAML can run code), never a visitor's include path, a limit required and bounded."""
    from swapkl.jobs import TasksRequest
    from swapkl.jobs.policy import Policy, PolicyError

    demo = Policy(demo=True, models=("default",), tasks=(TASK,), task_include_path="tests/fixtures/tasks",
                  max_task_limit=100)
    ok = TasksRequest(model="default", budget=2, tasks=(TASK,), limit=50, include_path="tests/fixtures/tasks")
    demo.check_request(ok)
    bad = {
        "a task not on the list": dict(tasks=("hellaswag",)),
        "a YAML path as a task name": dict(tasks=("/tmp/evil/task.yaml",)),
        "a visitor's include path": dict(include_path="/tmp/evil"),
        "no limit": dict(limit=None),
        "a limit past the bound": dict(limit=101),
        "too many shots": dict(num_fewshot=50),
        "a model off the list": dict(model="/etc"),
        "a budget past the bound": dict(budget=99),
        "no task": dict(tasks=()),
    }
    for why, change in bad.items():
        req = TasksRequest(**(ok.to_dict() | {"contract": ok.contract} | change))
        with pytest.raises(PolicyError):
            demo.check_request(req)
            pytest.fail(why)
    Policy(demo=False).check_request(TasksRequest(tasks=("x",), include_path="/anything"))  # a local user: theirs
    env = Policy.from_env({"SWAPKL_DEMO": "1", "SWAPKL_DEMO_TASKS": "arc_easy,piqa",
                           "SWAPKL_DEMO_MAX_TASK_LIMIT": "20"}, config_file="/nonexistent.toml")
    assert env.tasks == ("arc_easy", "piqa") and env.max_task_limit == 20


def test_tasks_job_runs_publishes_and_is_snapshotted(first_run, stories_path, cache, monkeypatch):
    """The job system runs a task-accuracy request (progress, the result on the job) and a new manager serves the
    same request from its snapshot without loading the model.  (The module's cache: the scores and the base model's
    accuracy come from the first run.)"""
    from swapkl.contract import Contract
    from swapkl.jobs import DONE, JobManager, TasksRequest

    monkeypatch.setenv("SWAPKL_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)
    req = TasksRequest(model=str(stories_path), contract=Contract(prompts=4, tokens=16), budget=1,
                       methods=("interchange",), tasks=(TASK,), limit=LIMIT, include_path=str(FIXTURE_TASKS))
    m = JobManager()
    try:
        job = m.submit(req)
        assert job.wait(600), job.summary()
        assert job.status == DONE, job.error
        t = job.tasks
        assert t.complete and [e["n"] for e in t.methods["interchange"]] == [1]
        assert t.base == first_run["base"] and job.result is not None
        p = job.progress()
        assert (p.step, p.steps) == (3, 3) and p.done == p.total
    finally:
        m.shutdown()
    m2 = JobManager(loader=lambda *a, **k: pytest.fail("a cached request must not load the model"))
    try:
        j2 = m2.submit(req)
        assert j2.status == DONE and j2.from_snapshot
        assert j2.tasks.methods == t.methods and j2.tasks.base == t.base
    finally:
        m2.shutdown()



def test_a_tasks_job_with_an_unknown_task_fails_in_one_line_before_the_model_loads(stories_path, cache, monkeypatch):
    """The worker loads a job's tasks before its pipeline (:func:`swapkl.jobs.runner._tasks_held`): a name lm-eval
    does not know ends the job with one line, and the model is never loaded."""
    from swapkl.contract import Contract
    from swapkl.jobs import ERROR, JobManager, TasksRequest

    monkeypatch.setenv("SWAPKL_CACHE", str(cache))
    monkeypatch.chdir(ROOT)
    req = TasksRequest(model=str(stories_path), contract=Contract(prompts=4, tokens=16), budget=1,
                       methods=("interchange",), tasks=("no_such_task_xyz",), limit=LIMIT,
                       include_path=str(FIXTURE_TASKS))
    m = JobManager(loader=lambda *a, **k: pytest.fail("an unknown task must fail before the model is loaded"))
    try:
        job = m.submit(req)
        assert job.wait(300), job.summary()
        assert job.status == ERROR and "unknown lm-eval task 'no_such_task_xyz'" in job.error
        assert "\n" not in job.error.strip()
    finally:
        m.shutdown()


def _panel_app():
    import json
    import os

    from dashboard import tasks_panel
    from swapkl.jobs import Job, TasksRequest
    from swapkl.removal.tasks import TasksResult

    job = Job("panel-test", TasksRequest(tasks=("tinystories_mc",)))
    job.done_from("test", tasks=TasksResult.from_dict(json.loads(open(os.environ["SWAPKL_TEST_TASKS"]).read())))
    tasks_panel.body(job)


def _demo_widgets_app():
    from dashboard import tasks_panel
    from swapkl.jobs.policy import Policy

    tasks_panel.task_widgets(Policy(demo=True, tasks=("tinystories_mc", "arc_easy"), max_task_limit=30))


def test_panel_draws_each_method_with_stderr_and_chance(first_run, tmp_path, monkeypatch):
    """The dashboard panel: per task (and n = 0 the base) each method's metric with lm-eval's stderr as error bars,
    the chance line, the table and the three downloads."""
    from streamlit.testing.v1 import AppTest

    f = tmp_path / "tasks.json"
    f.write_text(json.dumps(first_run))
    monkeypatch.setenv("SWAPKL_TEST_TASKS", str(f))
    at = AppTest.from_function(_panel_app, default_timeout=60).run()
    assert not at.exception, at.exception
    (chart,) = at.get("plotly_chart")
    fig = json.loads(chart.proto.spec)
    metric = "acc_norm,none"
    assert fig["layout"]["meta"]["metric"] == metric
    base = first_run["base"]
    for tr in fig["data"]:
        entries = first_run["methods"][tr["meta"]["method"]]
        assert tr["x"] == [0, 1, 2]
        assert tr["y"] == [base["metrics"][TASK][metric]] + [e["metrics"][TASK][metric] for e in entries]
        assert tr["error_y"]["array"] == [base["stderr"][TASK][metric]] + [e["stderr"][TASK][metric] for e in entries]
    assert any(s.get("y0") == 0.25 and s.get("line", {}).get("dash") == "dash" for s in fig["layout"]["shapes"])
    assert "lm-eval 0.4.13" in fig["layout"]["meta"]["contract"]
    assert len(at.get("download_button")) == 3


def test_demo_panel_offers_the_allow_list_and_no_include_path():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_demo_widgets_app, default_timeout=30).run()
    assert not at.exception, at.exception
    assert [w.key for w in at.text_input] == []            # nothing typed: no task name, no folder
    (ms,) = at.multiselect
    assert list(ms.options) == ["tinystories_mc", "arc_easy"]
    assert at.number_input(key="w_tasks_limit_demo").max == 30
