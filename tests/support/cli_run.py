"""Run ``python -m swapkl ARGS`` for a test and read its exit code, stdout and stderr, in one of two ways.

* In process (the default): ``swapkl.commands.cli.main(ARGS)`` with stdout and stderr captured, the given
  environment variables set for the call only and the working directory the repository root.  A fresh interpreter
  pays about 5 s of CPU importing torch and transformers before it reads an argument; this pays nothing.  An
  argparse error (``SystemExit``) gives its exit code, as the process would; any other exception that escapes
  ``main`` is a traceback in a real process, and here it propagates and fails the test.
* ``process=True``: a real ``python -m swapkl`` subprocess, for what only a real process shows: the ``__main__``
  entry point, what is printed at import, a fresh interpreter's state.  Each test file that checks the CLI keeps at
  least one such call.

Both return an object with ``returncode``, ``stdout`` and ``stderr`` (str), like ``subprocess.CompletedProcess``.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class CliRun:
    """What one ``swapkl`` run left: its exit code and everything it wrote to stdout and stderr."""
    returncode: int
    stdout: str
    stderr: str


def run_swapkl(*args, env: dict | None = None, process: bool = False, timeout: int = 300) -> CliRun:
    """``python -m swapkl *args`` with ``env`` (name -> value) added to the environment; in process unless
    ``process`` (``timeout`` in seconds bounds a subprocess only)."""
    argv = [str(a) for a in args]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", **(env or {})}
    if process:
        r = subprocess.run([sys.executable, "-m", "swapkl", *argv], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, **env), timeout=timeout)
        return CliRun(r.returncode, r.stdout, r.stderr)
    from swapkl.commands.cli import main

    saved = {k: os.environ.get(k) for k in env}
    cwd = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.update(env)
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse's usage errors (2) and --help (0), as the process would exit
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return CliRun(int(rc), out.getvalue(), err.getvalue())


def run_cli(*args, env_extra=None, process: bool = False, timeout=300):
    """``python -m swapkl *args`` with ``env_extra`` added to the environment: in process, or a real subprocess if
    ``process`` (a test of the entry point itself)."""
    return run_swapkl(*args, env=env_extra, process=process, timeout=timeout)
