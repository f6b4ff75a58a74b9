"""Removal methods: one file per method, listed by the registry without importing them.

* :mod:`~swapkl.removal.methods.base`: the interface (``func(ctx: MethodContext, budget) -> MethodOutput``, the
  spec, the cost plan);
* :mod:`~swapkl.removal.methods.registry`: lazy ``"module:object"`` entries, read from each module's ``METHODS``
  literal (:func:`discover`, run on import);
* every other module is one method file (``guided``, ``random``, ``bi``, ``sleb``, ``taylor``, ``laco``,
  ``recommended``).  A new method is one more file here (docs/architecture.md, "Add a removal method").

The curves runner, the dashboard, the CLI and the figures ask this package (label, offered, default sets, cost).
"""
from __future__ import annotations

from swapkl.removal.methods.base import (DEFAULT_RUNS, EvalPlan, MethodContext, MethodOutput, MethodSpec,
                                         cost_per_point, load)
from swapkl.removal.methods.registry import _REGISTRY  # noqa: F401  (the table itself: tests unregister through it)
from swapkl.removal.methods.registry import (GROUPS, available, declared, default_seeds, default_set,
                                             discover, find, get, label, offered, register,
                                             resolve, run_order, specs)

__all__ = ["DEFAULT_RUNS", "GROUPS", "EvalPlan", "MethodContext", "MethodOutput", "MethodSpec", "available",
           "cost_per_point", "declared", "default_seeds", "default_set", "discover", "find",
           "get", "label", "load", "offered", "register", "resolve", "run_order", "specs"]

discover()
