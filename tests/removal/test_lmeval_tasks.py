"""Which lm-eval task manager loads the tasks (``swapkl.measure.lmeval.load_tasks``): an include-path task loads from
a manager that indexes only that folder (milliseconds, not the seconds of lm-eval's ~15,000 registry YAMLs), with
the same configuration as through the full registry; a name the folder does not hold goes to the full registry."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from swapkl.measure import lmeval

FIXTURE_TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"
TASK = "tinystories_mc"


@pytest.fixture
def managers(monkeypatch):
    """A fresh table of task managers for this test (none made earlier in the process is reused)."""
    monkeypatch.setattr(lmeval, "_MANAGERS", {})
    return lmeval._MANAGERS


def test_an_include_path_task_loads_without_the_registry_and_equals_it(managers):
    ip = lmeval.check_include_path(FIXTURE_TASKS)
    t0 = time.process_time()
    tm, [local] = lmeval.load_tasks(ip, [TASK])
    local_s = time.process_time() - t0
    assert tm is managers[(ip, False)] and (ip, True) not in managers   # the registry was never indexed
    t0 = time.process_time()
    full = lmeval.load_task(lmeval.task_manager(ip), TASK)
    full_s = time.process_time() - t0
    assert local["config_sha"] == full["config_sha"] and local["versions"] == full["versions"]
    assert repr(local["spec"]) == repr(full["spec"]) and local["output_types"] == full["output_types"]
    assert sorted(local["leaves"]) == sorted(full["leaves"]) == [TASK]
    docs = [list(t.eval_docs) for t in (local["leaves"][TASK], full["leaves"][TASK])]
    assert docs[0] == docs[1] and len(docs[0]) > 0
    print(f"load: include path only {local_s:.2f} s CPU, with the registry {full_s:.2f} s")


def test_a_name_outside_the_include_path_goes_to_the_full_registry(managers):
    ip = lmeval.check_include_path(FIXTURE_TASKS)
    with pytest.raises(lmeval.TaskError, match=r"^unknown lm-eval task 'no_such_task_xyz' \(not in lm-eval's registry"):
        lmeval.load_tasks(ip, [TASK, "no_such_task_xyz"])
    assert (ip, True) in managers


def test_a_preloaded_block_serves_its_own_thread_only(managers):
    """Inside ``preloaded`` the same thread's ``load_tasks`` returns the loaded objects (no second load); another
    thread -- a server's second job -- loads its own; a nested block of the same tasks leaves the outer one's."""
    import threading

    ip = lmeval.check_include_path(FIXTURE_TASKS)
    seen = {}
    with lmeval.preloaded(ip, [TASK]) as held:
        assert lmeval.load_tasks(ip, [TASK]) is held
        with lmeval.preloaded(ip, [TASK]) as inner:
            assert inner is held
        assert lmeval.load_tasks(ip, [TASK]) is held          # the nested block did not drop the outer's tasks
        worker = threading.Thread(target=lambda: seen.update(other=lmeval.load_tasks(ip, [TASK])))
        worker.start()
        worker.join()
    assert seen["other"] is not held and seen["other"][1][0]["leaves"][TASK] is not held[1][0]["leaves"][TASK]
    assert not lmeval._HELD.tasks and lmeval.load_tasks(ip, [TASK]) is not held
