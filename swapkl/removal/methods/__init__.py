"""Removal methods: one file per method, listed by the registry without importing them.

* :mod:`~swapkl.removal.methods.base`: the interface (``func(ctx: MethodContext, budget) -> MethodOutput``, the
  spec, the cost plan);
* :mod:`~swapkl.removal.methods.registry`: lazy ``"module:object"`` entries, read from each module's ``METHODS``
  literal (:func:`discover`, run on import);
* every other module is one method file.  A new method is one more file here (docs/architecture.md, "Add a
  removal method").

The registry is the one list of methods and of what each supports (units, variants, calibration): the curves
runner, the dashboard, the CLI and the figures ask this package (label, offered, default sets, cost,
:func:`for_unit`, :func:`calibration_params`).
"""
from __future__ import annotations

from swapkl.removal.methods.base import (DEFAULT_RUNS, VARIANTS, EvalPlan, MethodContext, MethodOutput, MethodSpec,
                                         cost_per_point, load)
from swapkl.removal.methods.registry import _REGISTRY  # noqa: F401  (the table itself: tests unregister through it)
from swapkl.removal.methods.registry import (ANY_UNIT, GROUPS, MIN_CALIB_TOKENS, available, calib_tokens,
                                             calibration_caption,
                                             calibration_methods, calibration_params, declared, default_seeds,
                                             default_set, discover, find, for_unit, get, label,
                                             offered, refuse_other_units, register, resolve, run_order, specs,
                                             supports, unit_methods)

__all__ = ["ANY_UNIT", "DEFAULT_RUNS", "GROUPS", "MIN_CALIB_TOKENS", "VARIANTS", "EvalPlan", "MethodContext",
           "MethodOutput", "MethodSpec", "available", "calib_tokens", "calibration_caption", "calibration_methods", "calibration_params",
           "cost_per_point", "declared", "default_seeds", "default_set", "discover", "find",
           "for_unit", "get", "label", "load", "offered", "refuse_other_units", "register", "resolve", "run_order",
           "specs", "supports", "unit_methods"]

discover()
