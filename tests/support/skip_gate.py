"""CI's rule on skipped tests (issue 31): with ``SWAPKL_FAIL_ON_SKIP=1`` (set by ``.ci/run``) a test skipped for any
reason but the two allowed -- the browser tests on a machine without Debian's Chromium (``browser_util.need_browser``)
and the tests marked ``gpu`` on a machine without CUDA (``NO_GPU``) -- fails the run (exit 1) and is listed with its
reason, so a missing fixture, package or opt-in cannot hide behind a green run.  Hooks imported by ``conftest.py`` (and usable alone: ``pytest -p support.skip_gate``, ``tests/`` on
``sys.path``); the same under ``pytest -n N`` (pytest-xdist)."""
from __future__ import annotations

import os

ENV = "SWAPKL_FAIL_ON_SKIP"
#: the skip reason CI accepts for the browser tests (the start of browser_util.need_browser's message)
ALLOWED = "needs Debian's chromium and chromium-driver"
#: ... and for the tests marked ``gpu`` (tests/gpu/) on a machine without CUDA (tests/conftest.py gives this reason)
NO_GPU = "needs a CUDA device (marker gpu: the GPU acceptance script, run on the device machine)"
ACCEPTED = (ALLOWED, NO_GPU)
_SKIPPED: list[tuple[str, str]] = []


def _reason(report) -> str:
    lr = report.longrepr
    text = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return text.removeprefix("Skipped: ")


def pytest_collectreport(report):
    """A module skipped while it is imported (``pytest.skip(..., allow_module_level=True)``, ``importorskip``)."""
    if report.skipped:
        _SKIPPED.append((report.nodeid, _reason(report)))


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, _reason(report)))


def pytest_sessionfinish(session, exitstatus):
    # Under pytest-xdist a worker's skips reach the controller's hooks above (xdist replays every test report and
    # each skipped collection report there), so the controller alone judges; a worker says nothing.
    if os.environ.get(ENV) != "1" or hasattr(session.config, "workerinput"):
        return
    bad = [(node, why) for node, why in _SKIPPED if not why.startswith(ACCEPTED)]
    if not bad:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    say = tr.write_line if tr is not None else print
    if tr is not None:
        tr.ensure_newline()
    say(f"{ENV}=1: {len(bad)} test(s) skipped for a reason CI does not accept (only \"{ALLOWED} ...\" or \"{NO_GPU}\"):")
    for node, why in bad:
        say(f"  SKIPPED {node}: {why}")
    if session.exitstatus == 0:
        session.exitstatus = 1
