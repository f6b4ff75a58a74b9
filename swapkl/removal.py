"""Compatibility names: the removal code lives in :mod:`swapkl.selection` (scores to removal sets),
:mod:`swapkl.verdict` (the regime verdict), :mod:`swapkl.memo` (the evaluation memo) and :mod:`swapkl.curves`
(the removal-curve runner and :class:`CurvesResult`).  New code imports from those modules."""
from __future__ import annotations

from swapkl.curves import (CurvesResult, ScoresMismatch, check_evaluator_context, check_same_model, check_scores,
                           removal_curves)
from swapkl.memo import EvalMemo, disk_memo
from swapkl.selection import (BudgetError, check_budget, default_candidates, layer_scores, max_feasible, nested,
                              partner_mask, random_sets, scan, select)
from swapkl.verdict import adjacent_pairs, regime_verdict

__all__ = ["BudgetError", "CurvesResult", "EvalMemo", "ScoresMismatch", "adjacent_pairs", "check_budget",
           "check_evaluator_context", "check_same_model", "check_scores", "default_candidates", "disk_memo",
           "layer_scores", "max_feasible", "nested", "partner_mask", "random_sets", "regime_verdict",
           "removal_curves", "scan", "select"]
