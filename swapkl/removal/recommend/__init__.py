"""The recommendation: which n layers to remove, with the evidence, in one package.

* :mod:`~swapkl.removal.recommend.recommendation`: :func:`recommend` (the search through the curves runner) and its
  result, :class:`Recommendation`;
* :mod:`~swapkl.removal.recommend.confirm`: the rule that picks the recommended set on calibration text and confirms
  it (docs/recommend-rule.md);
* :mod:`~swapkl.removal.recommend.paired`: the paired comparison of a method's set with every other method's on the
  same held-out windows.

The search itself is the removal method ``"recommend"`` (:mod:`swapkl.removal.methods.recommended`, one file like every
method).  The package exports :mod:`recommendation`'s public names.
"""
from __future__ import annotations

from swapkl.removal.recommend.recommendation import (DEFAULT_CALIB_TOKENS, DEFAULT_CALIB_WINDOWS, DEFAULT_WIDTH, LABEL,
                                                     SEED_METHODS, Recommendation, default_top_k, recommend,
                                                     recommend_plan, search, search_params, sleb_cost)

__all__ = ["DEFAULT_CALIB_TOKENS", "DEFAULT_CALIB_WINDOWS", "DEFAULT_WIDTH", "LABEL", "SEED_METHODS", "Recommendation",
           "default_top_k", "recommend", "recommend_plan", "search", "search_params", "sleb_cost"]
