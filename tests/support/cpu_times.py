"""CPU seconds per test, to find what makes the suite long on a machine whose cores it fills.

Opt-in: ``SWAPKL_CPU_TIMES=PREFIX python3 -m pytest ...`` (``tests/conftest.py`` registers this module when the
variable is set).  Each process that runs tests (the one pytest process, or every pytest-xdist worker) writes
``PREFIX.<worker>.json``: a list of ``[nodeid, cpu_s, wall_s]``, where ``cpu_s`` is user + system time of the test
process and of the child processes it waited for during the test (CLI subprocesses, dashboard servers, torchrun
ranks; not Chromium, which chromedriver starts and reaps).  ``python3 -m benchmarks run suite_cpu PREFIX`` sums them per file."""
from __future__ import annotations

import json
import os
import resource
import time

import pytest

ENV = "SWAPKL_CPU_TIMES"
_ROWS: list[tuple[str, float, float]] = []


def cpu_seconds() -> float:
    """User + system seconds of this process and of every child process it has waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    yield
    _ROWS.append((item.nodeid, cpu_seconds() - cpu0, time.perf_counter() - wall0))


def pytest_sessionfinish(session):
    prefix = os.environ.get(ENV)
    if not prefix or not _ROWS:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{prefix}.{worker}.json", "w") as f:
        json.dump(_ROWS, f)
