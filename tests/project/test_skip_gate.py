"""CI's rule on skips (tests/support/skip_gate.py): with SWAPKL_FAIL_ON_SKIP=1 only the browser tests' "no Chromium" skip
and the GPU tests' "no CUDA" skip pass; any other skip -- in a test or a whole module -- fails the run and is named;
without it, nothing changes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/: the skip gate is support.skip_gate

BROWSER = '''import pytest
pytest.skip("needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver): apt-get",
            allow_module_level=True)
'''
OTHER = '''import pytest
def test_runs():
    assert True
def test_opt_in():
    pytest.skip("reads the 98 MB default GGUF: SWAPKL_SLOW_TESTS=1")
'''
GPU = '''import pytest
from support.skip_gate import NO_GPU
def test_on_the_device():
    pytest.skip(NO_GPU)
'''
MODULE = '''import pytest
pytest.importorskip("no_such_package_here")
'''


def _pytest(tmp_path, files: dict, gate: bool, *extra: str):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    env.pop("SWAPKL_FAIL_ON_SKIP", None)
    if gate:
        env["SWAPKL_FAIL_ON_SKIP"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "support.skip_gate", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), *extra, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_only_the_browser_skip_passes_ci(tmp_path):
    ok = _pytest(tmp_path, {"test_browser_x.py": BROWSER, "test_fine.py": "def test_a():\n    assert True\n"}, True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 passed, 1 skipped" in ok.stdout


def test_the_no_cuda_skip_of_the_gpu_tests_passes_ci(tmp_path):
    """tests/gpu/ (marker gpu) is skipped on a machine without CUDA with support.skip_gate.NO_GPU: CI accepts it."""
    ok = _pytest(tmp_path, {"test_gpu_x.py": GPU, "test_browser_x.py": BROWSER}, True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "2 skipped" in ok.stdout


def test_any_other_skip_fails_ci_and_is_named(tmp_path):
    files = {"test_browser_x.py": BROWSER, "test_other.py": OTHER, "test_module.py": MODULE}
    bad = _pytest(tmp_path, files, True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "2 test(s) skipped for a reason CI does not accept" in bad.stdout
    assert "SKIPPED test_other.py::test_opt_in: reads the 98 MB default GGUF: SWAPKL_SLOW_TESTS=1" in bad.stdout
    assert "SKIPPED test_module.py: could not import 'no_such_package_here'" in bad.stdout
    assert "test_browser_x" not in bad.stdout.split("does not accept")[1]
    # outside CI the same run passes (skips are reported as usual)
    assert _pytest(tmp_path, files, False).returncode == 0


def test_the_gate_judges_the_skips_of_parallel_workers(tmp_path):
    """Under pytest-xdist (the README's ``-n`` run) the skips happen in the workers: the controller still names each
    one CI does not accept, once, and fails; the browser skip still passes."""
    files = {"test_browser_x.py": BROWSER, "test_other.py": OTHER, "test_module.py": MODULE,
             "test_fine.py": "def test_a():\n    assert True\n"}
    bad = _pytest(tmp_path, files, True, "-n", "2", "-p", "xdist")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "2 test(s) skipped for a reason CI does not accept" in bad.stdout
    assert bad.stdout.count("SKIPPED test_other.py::test_opt_in: reads the 98 MB default GGUF") == 1
    assert bad.stdout.count("SKIPPED test_module.py: could not import 'no_such_package_here'") == 1
    assert "test_browser_x" not in bad.stdout.split("does not accept")[1]
    (tmp_path / "ok").mkdir()
    ok = _pytest(tmp_path / "ok", {"test_browser_x.py": BROWSER, "test_fine.py": "def test_a():\n    assert True\n"},
                 True, "-n", "2", "-p", "xdist")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 passed, 1 skipped" in ok.stdout
