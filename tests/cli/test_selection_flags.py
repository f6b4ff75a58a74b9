"""curves, tasks and heal read the selection rule's flags (--include-boundary, --partners) through one pair of
helpers, so the plan a heal selects its set under is the plan the curves chose theirs under."""
from __future__ import annotations

import pytest

from swapkl.commands.cli import build_parser
from swapkl.errors import SwapklError


def _plan_fields(argv):
    from swapkl.commands import heal
    from swapkl.commands.common import removal_plan, selection_fields

    a = build_parser().parse_args(argv)
    if a.command == "heal":
        plan = heal._plan(a, "matched", 2, ("interchange",))
    else:
        plan = removal_plan(a, ["interchange"], **selection_fields(a))
    return plan.exclude_boundary, plan.partners, plan.spacing


@pytest.mark.parametrize("flags, want", [
    ([], (True, None, 1)),
    (["--include-boundary", "--partners", "adjacent", "--spacing", "0"], (False, "adjacent", 0)),
    (["--partners", "3"], (True, 3, 1)),
])
def test_heal_plans_as_curves_and_tasks(flags, want):
    curves = _plan_fields(["curves", "m", "--budget", "2", *flags])
    tasks = _plan_fields(["tasks", "m", "--budget", "2", "--tasks", "hellaswag", *flags])
    heal = _plan_fields(["heal", "m", "--method", "interchange", "--n", "2", *flags])
    assert curves == tasks == heal == want


def test_bad_partners_is_one_line():
    a = build_parser().parse_args(["heal", "m", "--method", "interchange", "--n", "2", "--partners", "near"])
    from swapkl.commands.common import selection_fields

    with pytest.raises(SwapklError, match=r"^--partners must be adjacent, all or an integer K \(got 'near'\)$"):
        selection_fields(a)
