"""The pytest-benchmark micro-benchmarks of ``benchmarks/test_*.py``: skipped unless ``--benchmark-only`` (or
``SWAPKL_BENCH=1``), so a plain ``pytest`` never times anything; ``python -m pytest tests/`` does not collect them.

    python -m pytest benchmarks --benchmark-only --benchmark-autosave --benchmark-storage=benchmarks/results/pytest
    python -m pytest benchmarks --benchmark-only --benchmark-compare   # against the last saved run

pytest-benchmark keeps one JSON per run under ``benchmarks/results/pytest/<machine id>/NNNN_<commit>_<date>.json``
(its own storage: machine, commit, time, min/median/rounds per benchmark)."""
from __future__ import annotations

import os

import pytest

ENV = "SWAPKL_BENCH"


def pytest_collection_modifyitems(config, items):
    if config.getoption("benchmark_only", False) or os.environ.get(ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"a benchmark: runs with --benchmark-only or {ENV}=1")
    for item in items:
        item.add_marker(skip)
