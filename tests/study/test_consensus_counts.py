"""docs/consensus.md's two counts as the study states them (:func:`swapkl.study.across.consensus_statements`),
counted from hand-made cells: at the headline n and at some n, models where a consensus is significantly worse than
the better protocol; among every cell where R and I differ, those where it is significantly cheaper (ΔPPL) or more accurate
(ΔAcc) than the worse."""
from __future__ import annotations

from types import SimpleNamespace

from swapkl.study.across import consensus_statements

TASK = "wikitext_lastword"


def cell(worse: bool, differ: bool, gain: bool) -> dict:
    return {"worse_than_better": worse, "r_i_differ": differ, "cheaper_than_worse": gain}


def row(ppl: list, acc: list) -> dict:
    """A study row whose consensus-mean cells at n = 1, 2 are ``ppl`` (held-out) and ``acc`` (the task's)."""
    return {"removal": {"consensus": [{"n": n, "consensus-mean": c} for n, c in enumerate(ppl, 1)]},
            "tasks": {"contract": {"tasks": [TASK]},
                      "consensus": [{"n": n, TASK: {"consensus-mean": c}} for n, c in enumerate(acc, 1)]}}


def test_the_counts_and_their_words():
    rows = [row([cell(True, True, False), cell(False, True, True)], [cell(False, False, False), cell(True, True, True)]),
            row([cell(False, False, False), cell(True, True, False)], [cell(False, True, True), cell(False, False, False)]),
            row([cell(False, True, True), cell(False, False, False)], [cell(False, False, False), cell(False, True, False)])]
    ppl, acc = consensus_statements(SimpleNamespace(done=lambda: rows))
    # held-out: worse at n = 2 on model 2 only, at some n on models 1 and 2; R and I differ in 4 cells, the consensus cheaper than the worse in 2
    assert ppl.startswith("consensus-mean is significantly worse than the better of R and I at n = 2 on 1 of 3 models "
                          "(held-out ΔPPL %, paired window bootstrap), at some n on 2; significantly cheaper than the worse in 2 of 4 "
                          "cells where R and I differ")
    # the task: worse at n = 2 on model 1 only (and at no other n); R and I differ in 3 cells, the consensus more accurate than the worse in 2
    assert acc.startswith(f"consensus-mean is significantly worse than the better of R and I at n = 2 on 1 of 3 models "
                          f"({TASK} ΔAcc, paired document bootstrap), at some n on 1; significantly more accurate than the worse in "
                          "2 of 3 cells where R and I differ")
