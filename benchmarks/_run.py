"""What ``python -m benchmarks`` and ``python -m experiments`` share: where a benchmark or experiment lives, how its
child process runs (wall and CPU seconds, peak resident memory), and the provenance stamped on what they write.

A benchmark or experiment is a module of ``benchmarks/`` or ``experiments/`` (``python -m PACKAGE.NAME ...``) or a
shell script there (``bash PACKAGE/NAME.sh ...``).  It runs as a child process from the tree's root with
``PYTHONPATH=ROOT:ROOT/tests`` (the test helpers it imports as ``support.*``), so no script edits its import path."""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("benchmarks", "experiments")


def git(*args: str, cwd: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit(rev: str = "HEAD") -> str:
    """The short hash of ``rev``; for HEAD with ``-dirty`` when the checkout has uncommitted changes."""
    h = git("rev-parse", "--short", rev) or "unknown"
    if rev == "HEAD" and git("status", "--porcelain", "--untracked-files=no"):
        h += "-dirty"
    return h


def machine() -> str:
    """The folder name of this machine's results: its host name and core count (``host-2cpu``)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", platform.node() or "unknown")
    return f"{host}-{os.cpu_count()}cpu"


def provenance(command: list[str] | str, **extra) -> dict:
    """Commit, host, command and date of a run (UTC, ISO 8601), plus the interpreter and ``extra``."""
    cmd = command if isinstance(command, str) else shlex.join(command)
    return {"commit": commit(), "branch": git("rev-parse", "--abbrev-ref", "HEAD"), "host": platform.node(),
            "machine": machine(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "command": cmd,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **extra}


def find(name: str, root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> tuple[str, Path]:
    """(package, file) of the benchmark or experiment ``name`` (``.py`` or ``.sh``)."""
    for pkg in packages:
        for ext in (".py", ".sh"):
            p = root / pkg / f"{name}{ext}"
            if p.is_file():
                return pkg, p
    raise SystemExit(f"no {' or '.join(packages)} named {name!r} (list them: python -m {packages[0]} list)")


def names(pkg: str, root: Path = ROOT) -> list[str]:
    return sorted(p.stem for p in (root / pkg).iterdir()
                  if p.suffix in (".py", ".sh") and not p.stem.startswith("_") and p.is_file())


def child_argv(pkg: str, path: Path, args: list[str]) -> list[str]:
    if path.suffix == ".sh":
        return ["bash", f"{pkg}/{path.name}", *args]
    return [sys.executable, "-m", f"{pkg}.{path.stem}", *args]


def child_env(tree: Path = ROOT, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "tests")]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def run_child(argv: list[str], cwd: Path = ROOT, env: dict | None = None, echo: bool = True) -> dict:
    """Run ``argv`` in ``cwd``; its stdout is echoed (``echo``) and kept.  Returns rc, stdout, wall and CPU seconds
    and the peak resident memory (MiB) of the child and the processes it waited for (``wait4``'s ``ru_maxrss``)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, cwd=cwd, env=env if env is not None else child_env(cwd), stdout=subprocess.PIPE,
                         text=True, bufsize=1)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()
    p.stdout.close()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": p.returncode, "wall_s": round(time.perf_counter() - t0, 3),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 3), "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
            "stdout": "".join(lines)}


def option_given(args: list[str], key: str) -> bool:
    opt = "--" + key.replace("_", "-")
    return any(a == opt or a.startswith(opt + "=") for a in args)


def _value(v: str):
    """A command-line value as the JSON scalar it spells (``4`` -> 4, ``2e-3`` -> 0.002), else the string."""
    try:
        x = json.loads(v)
    except ValueError:
        return v
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else v


def with_config(config: dict, args: list[str]) -> tuple[dict, list[str]]:
    """The effective configuration (``config`` overridden by the ``--key value`` options of ``args``) and the
    child's arguments: every configured option not given in ``args`` first, then ``args`` as given."""
    pre: list[str] = []
    eff = dict(config)
    for key, value in config.items():
        if option_given(args, key):
            continue
        if value is True:
            pre.append("--" + key.replace("_", "-"))
        elif value is not False and value is not None:
            pre += ["--" + key.replace("_", "-"), str(value)]
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            k, eq, v = a[2:].partition("=")
            k = k.replace("-", "_")
            if eq:
                eff[k] = _value(v)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                eff[k] = _value(args[i + 1])
                i += 1
            else:
                eff[k] = True
        else:
            eff.setdefault("_positional", []).append(a)
        i += 1
    return eff, pre + args


def json_option(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--json" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--json="):
            return a.split("=", 1)[1]
    return None


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stamp(path: Path, prov: dict) -> bool:
    """Add ``provenance`` to the JSON object the run wrote at ``path`` (kept if the file has one already)."""
    d = read_json(path)
    if not isinstance(d, dict):
        return False
    d.setdefault("provenance", prov)
    path.write_text(json.dumps(d, indent=1) + "\n")
    return True
