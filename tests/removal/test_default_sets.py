"""Every default method set comes from the method registry (``methods.default_set(kind)``), declared as data by the
method files (``default``, ``cli_default``, ``default_in``); the sets are the ones the study, ``swapkl tasks`` and the
dashboard's task request ran before they were declared there (issue 52)."""
from __future__ import annotations

import pytest

from swapkl.commands.cli import build_parser
from swapkl.errors import SwapklError
from swapkl.jobs.requests import TasksRequest
from swapkl.removal import methods as M
from swapkl.removal.methods import registry
from swapkl.study.plan import StudyPlan

#: the sets as they were hard-coded before (study/plan.py, commands/tasks.py, jobs/requests.py) and as the
#: registry gave them (dashboard, cli)
BEFORE = {"dashboard": ("replacement", "interchange", "random"),
          "cli": ("replacement", "interchange", "random", "bi", "sleb"),
          "study": ("replacement", "interchange", "random", "bi"),
          "tasks": ("replacement", "interchange", "random")}


#: what changed since: the study compares the two protocols' consensus (issue 53, docs/consensus.md)
NOW = {**BEFORE, "study": ("replacement", "interchange", "consensus-mean", "consensus-max", "random", "bi")}


def test_every_default_set_is_unchanged():
    assert set(registry.DEFAULT_SETS) == set(BEFORE)
    for kind, names in NOW.items():
        assert M.default_set(kind) == names, kind


def test_the_study_the_tasks_command_and_the_tasks_request_take_their_defaults_from_the_registry():
    assert StudyPlan().methods == M.default_set("study") == NOW["study"]
    assert TasksRequest().methods == M.default_set("tasks") == BEFORE["tasks"]
    parser = build_parser()
    assert parser.parse_args(["tasks", "m", "--budget", "1", "--tasks", "t"]).methods == "replacement,interchange,random"
    assert parser.parse_args(["study", "m"]).methods == ",".join(NOW["study"])


def test_a_method_joins_a_default_set_as_data(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register("deepest", target="x:y", order=50, default_in=["tasks"])
    assert M.default_set("tasks") == BEFORE["tasks"] + ("deepest",)
    assert M.default_set("study") == NOW["study"]
    assert M.get("deepest").default_sets == ("tasks",) and M.get("replacement").default_sets == (
        "dashboard", "cli", "study", "tasks")
    with pytest.raises(SwapklError, match="default_in"):
        registry.register("other", target="x:y", default_in=["nightly"])
    with pytest.raises(SwapklError, match="unknown default method set 'nightly'"):
        M.default_set("nightly")
