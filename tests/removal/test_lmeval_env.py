"""swapkl's lm-eval evaluation leaves out lm-eval's environment report (``torch.utils.collect_env``: a ``pip list``
subprocess and system commands per evaluated model) and gives the same metrics as ``simple_evaluate`` with it;
other threads, and any lm-eval call outside swapkl's evaluation, still get the full report."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from swapkl.model.checkpoints import load_checkpoint
from swapkl.measure import lmeval

ROOT = Path(__file__).resolve().parents[2]
TASK, LIMIT = "tinystories_mc", 12


@pytest.fixture
def reports(monkeypatch):
    """Every environment report lm-eval asks torch for, counted (and made instant)."""
    import torch.utils.collect_env as ce

    calls = []

    def report():
        calls.append(threading.current_thread().name)
        return "the environment report"

    monkeypatch.setattr(ce, "get_pretty_env_info", report)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(ROOT)  # the fixture task's data file is relative to the checkout
    return calls


def test_swapkls_evaluation_has_no_report_and_the_same_metrics(stories_path, reports):
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    ck = load_checkpoint(str(stories_path), device="cpu")
    tm, tasks = lmeval.load_tasks(str(ROOT / "tests" / "fixtures" / "tasks"), [TASK])
    ours = lmeval.evaluate(ck.model, ck.tokenizer, tasks[0], tm, limit=LIMIT)
    assert reports == []
    full = lm_eval.simple_evaluate(model=HFLM(pretrained=ck.model, tokenizer=ck.tokenizer, batch_size=16),
                                   tasks=list(tasks[0]["spec"]), task_manager=tm, limit=LIMIT,
                                   log_samples=True, verbosity="ERROR")  # as swapkl's: every document's scores
    assert len(reports) == 1 and full["pretty_env_info"] == "the environment report"
    assert ours == lmeval.rows_of(full) and set(ours["metrics"][TASK]) == {"acc,none", "acc_norm,none"}


def test_only_the_blocks_own_thread_skips_the_report(reports):
    import lm_eval.evaluator as ev

    seen = {}

    def other():
        d = {}
        ev.add_env_info(d)
        seen["other"] = d["pretty_env_info"]

    with lmeval._no_environment_report():
        inside = {}
        ev.add_env_info(inside)
        t = threading.Thread(target=other, name="other")
        t.start()
        t.join()
        with lmeval._no_environment_report():  # nested: still skipped, and restored to "skip" on exit
            pass
        again = {}
        ev.add_env_info(again)
    after = {}
    ev.add_env_info(after)
    assert inside["pretty_env_info"] == again["pretty_env_info"] == lmeval.NO_ENV_REPORT
    assert inside["lm_eval_version"] == lmeval.lm_eval_version()
    assert seen["other"] == after["pretty_env_info"] == "the environment report" and reports == ["other", "MainThread"]
