"""A room of visitors on a fresh demo server, on the real default model (SmolLM2-135M-Instruct).

    python -m benchmarks run visitors [--ks 1,4,8] [--json benchmarks/results/visitors.json]

For each K (in one run): a fresh server started the README's way for a demo (``./run.sh --demo``, the project's
``.venv`` when there is one), an empty results cache with the converted default model linked in (the one-time GGUF
conversion is not counted), and K headless Chromium visitors that open the page within 4 s of each other, keep
every default and press Compute.  Printed per K: wall time from the first page open to the last Done, and its
ratio to K = 1; ``/_stcore/health`` latency (median, maximum) polled every 0.25 s throughout; peak resident
memory of the server's process tree; the number of computations the server ran (one, shared, when every visitor
keeps the defaults) and of model loads.  Needs chromium, chromedriver and selenium (tests/support/browser_util.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from support.browser_util import free_port  # noqa: E402
from support.visitors import Visitor, computations, room  # noqa: E402


def venv_env(env: dict) -> dict:
    venv = ROOT / ".venv"
    if (venv / "bin" / "python").exists():
        env = dict(env, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
        env.pop("PYTHONHOME", None)
    return env


def fresh_cache() -> Path:
    d = Path(tempfile.mkdtemp(prefix="bench-visitors-", dir=ROOT / "cache"))
    src = Path(os.environ.get("SWAPKL_BENCH_MODELS", ROOT / "cache" / "models"))
    if src.is_dir():
        (d / "models").symlink_to(src.resolve(), target_is_directory=True)
    return d


def serve(cache: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = venv_env(dict(os.environ, SWAPKL_CACHE=str(cache), HF_HUB_OFFLINE="1"))
    proc = subprocess.Popen(["bash", "run.sh", "--demo", "--server.port", str(port)], cwd=ROOT, env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"run.sh exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read().strip() == b"ok":
                return proc, url
        except OSError:
            time.sleep(0.5)
    raise SystemExit("the server did not start")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def one_room(k: int, tmp: Path) -> dict:
    cache = fresh_cache()
    proc, url = serve(cache, tmp / f"server-{k}.log")
    try:
        vs = [Visitor(f"v{i}") for i in range(k)]
        fig = room(url, proc.pid, vs, tmp / f"room-{k}", spread_s=4.0, timeout=1200)
        log = cache / "logs" / "dashboard.log"
        fig.update(k=k, computations=computations(log),
                   model_loads=log.read_text(encoding="utf-8").count("model loaded:") if log.exists() else 0,
                   done=sum(v.done is not None for v in vs), errors=[v.error for v in vs if v.error],
                   first_paint_s=[round(v.opened, 1) for v in vs if v.opened is not None])
        return fig
    finally:
        stop(proc)
        shutil.rmtree(cache, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="1,4,8")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    ks = [int(x) for x in a.ks.split(",")]
    with tempfile.TemporaryDirectory(prefix="swapkl-visitors-") as t:
        rows = [one_room(k, Path(t)) for k in ks]
    base = next((r["last_done_s"] for r in rows if r["k"] == 1 and r["last_done_s"]), None)
    print(f"{'K':>3} {'Done':>5} {'last Done s':>11} {'ratio':>6} {'health med s':>12} {'health max s':>12} "
          f"{'peak RSS MB':>11} {'computations':>12} {'model loads':>11}")
    for r in rows:
        ratio = r["last_done_s"] / base if base and r["last_done_s"] else float("nan")
        r["ratio_to_k1"] = ratio
        print(f"{r['k']:>3} {r['done']:>2}/{r['k']:<2} {r['last_done_s'] or float('nan'):>11.1f} {ratio:>6.2f} "
              f"{r['health_median_s']:>12.4f} {r['health_max_s']:>12.3f} {r['peak_rss_mb']:>11.0f} "
              f"{r['computations']:>12} {r['model_loads']:>11}")
        if r["errors"]:
            print("   errors:", r["errors"])
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rows": rows, "machine": f"{os.cpu_count()} cores"}, indent=1))
    return 0 if all(r["done"] == r["k"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
