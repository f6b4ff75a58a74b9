"""What a user gets: the dashboard started the README's way, driven in a real browser, on the default model.

    python -m benchmarks run served_default [--json out.json] [--keep]

1. **Served cold.**  ``./run.sh --server.port P`` exactly as the README says -- with the project's ``.venv``
   active when there is one (most users keep it inside the project, where the server's folder also holds it),
   the shipped ``.streamlit/config.toml``, and a fresh score cache inside the project (``cache/bench-served-*``;
   the converted default model folder is linked in, so the one-time GGUF conversion is not counted).  Debian's
   Chromium (selenium, ``/usr/bin/chromium``) opens the page, keeps every default and presses **Compute**.
   The click comes ``SWAPKL_BENCH_READ_S`` (default 5) seconds after first paint, as a user reads the settings.
   Printed: first paint (page load -> title), then from the click: first pair (the lead figure is drawn), verdict
   (the regime heading), Done.  Also the CPU seconds of the server process and of Chromium during the run.
2. **Library cold**, same run, same request, same interpreter: ``benchmarks/default_cold_cached.py --cold-only``
   (a :class:`swapkl.jobs.JobManager` job, no server, no browser), on another fresh cache.
3. Their **ratio** (served Done / library done).
4. **Cached reopen in the browser**: the server restarted on the served cache, a new browser session, Compute
   pressed: seconds from the click until "Done" and the lead figure are on screen.

Screenshots go to ``artifacts/served/`` (first view, removal curves).  Needs chromium, chromedriver, selenium.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ART = ROOT / "artifacts" / "served"
TICK = 0.0  # set from os.sysconf at start

# status of the page in one cheap script call: a few targeted queries, no XPath over the whole document (the
# bench's own polling must not load the browser it measures)
STATUS_JS = """
const alerts = [...document.querySelectorAll('[data-testid="stAlertContainer"]')].map(e => e.textContent);
const err = alerts.find(t => t.trim().startsWith('Error:'));
return {
  title: [...document.querySelectorAll('h1')].some(h => h.textContent.includes('protocol-aware layer redundancy')),
  compute: [...document.querySelectorAll('button')].some(b => b.textContent.trim() === 'Compute'),
  // charts holding data (the empty frame the start page shows before Compute has no trace)
  plots: [...document.querySelectorAll('.js-plotly-plot')].filter(
    e => e.querySelector('.scatterlayer .trace, .heatmaplayer .hm')).length,
  verdict: [...document.querySelectorAll('h3')].some(h => h.textContent.includes('prefer')),
  done: alerts.some(t => t.includes('Done:')),
  cached: alerts.some(t => t.includes('loaded from the cache')),
  error: err || null,
};
"""


# seconds between the page being drawn and the click on Compute (a user reads the settings first; the server
# imports torch and the engine meanwhile), the same for the cold run and the cached reopen
READ_S = float(os.environ.get("SWAPKL_BENCH_READ_S", "5.0"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """utime + stime of a process (seconds), or 0 when it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children of each of its threads: Chromium starts renderers from a
    launcher thread, so ``task/<pid>/children`` alone misses them)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = []
        for f in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids += f.read_text().split()
            except OSError:
                pass
        for k in dict.fromkeys(kids):
            out.append(int(k))
            todo.append(int(k))
    return out


def fresh_cache(tag: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=f"bench-{tag}-", dir=ROOT / "cache"))
    models = ROOT / "cache" / "models"
    if models.is_dir():
        (d / "models").symlink_to(models, target_is_directory=True)
    return d


def venv_env(env: dict) -> tuple[dict, str]:
    """The environment of a user who activated the project's .venv (if it exists), and its python."""
    venv = ROOT / ".venv"
    if (venv / "bin" / "python").exists():
        env = dict(env, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
        env.pop("PYTHONHOME", None)
        return env, str(venv / "bin" / "python")
    return env, sys.executable


class Server:
    def __init__(self, cache: Path, log: Path):
        self.port = free_port()
        env, self.python = venv_env(dict(os.environ, SWAPKL_CACHE=str(cache), HF_HUB_OFFLINE="1"))
        self.log = open(log, "w")
        self.proc = subprocess.Popen(["bash", "run.sh", "--server.port", str(self.port)], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"run.sh exited ({self.proc.returncode}): {Path(log).read_text()[-2000:]}")
            try:
                if urllib.request.urlopen(self.url + "/_stcore/health", timeout=2).read().strip() == b"ok":
                    return
            except OSError:
                time.sleep(0.5)
        raise SystemExit("the server did not start")

    def cpu(self) -> float:
        return cpu_s(self.proc.pid) + sum(cpu_s(p) for p in descendants(self.proc.pid))

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def browser(tmp: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
              "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-extensions", f"--user-data-dir={tmp}", "--window-size=1500,1100"):
        opts.add_argument(a)
    svc = Service(CHROMEDRIVER)
    drv = webdriver.Chrome(service=svc, options=opts)
    drv.set_page_load_timeout(120)
    return drv, svc


def browser_cpu(svc) -> float:
    pid = svc.process.pid
    return sum(cpu_s(p) for p in [pid] + descendants(pid))


def wait_for(drv, cond, timeout: float, poll: float = 0.25) -> dict:
    deadline = time.perf_counter() + timeout
    while True:
        st = drv.execute_script(STATUS_JS)
        if st.get("error"):
            raise SystemExit(f"the app shows an error: {st['error']}")
        if cond(st):
            return st
        if time.perf_counter() > deadline:
            raise SystemExit(f"timed out waiting; page status {st}")
        time.sleep(poll)


def click_compute(drv) -> None:
    from selenium.webdriver.common.by import By

    el = drv.find_element(By.XPATH, "//button[.//p[normalize-space(.)='Compute']]")
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    el.click()


def _curves_drawn(drv) -> bool:
    """Whether the removal-curves figure is on the page (a figure redrawn while it is read counts as not yet)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return any("ΔPPL after layer removal" in e.text for e in drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"))
    except StaleElementReferenceException:
        return False


def served_cold(cache: Path, tmp: Path) -> dict:
    srv = Server(cache, tmp / "served.log")
    drv, svc = browser(tmp / "chrome1")
    try:
        t = time.perf_counter()
        drv.get(srv.url)
        wait_for(drv, lambda s: s["title"] and s["compute"], 120, 0.05)
        first_paint = time.perf_counter() - t
        time.sleep(READ_S)  # a user reads the page before pressing Compute
        cpu0_srv, cpu0_br = srv.cpu(), browser_cpu(svc)
        marks: dict = {}
        click_compute(drv)
        t0 = time.perf_counter()
        deadline = t0 + 1800
        while "done" not in marks:
            st = drv.execute_script(STATUS_JS)
            now = time.perf_counter() - t0
            if st.get("error"):
                raise SystemExit(f"the app shows an error: {st['error']}")
            if st["plots"] and "first_pair" not in marks:
                marks["first_pair"] = now
            if st["verdict"] and "verdict" not in marks:
                marks["verdict"] = now
            if st["done"]:
                marks["done"] = now
            if time.perf_counter() > deadline:
                raise SystemExit(f"no Done after 30 min; status {st}")
            time.sleep(1.0)
        cpu_srv, cpu_br = srv.cpu() - cpu0_srv, browser_cpu(svc) - cpu0_br
        ART.mkdir(parents=True, exist_ok=True)
        time.sleep(1.0)
        drv.save_screenshot(str(ART / "first-view.png"))
        from selenium.webdriver.common.by import By

        drv.find_element(By.XPATH, "//span[normalize-space(.)='Removal curves']").click()
        t = time.perf_counter()
        while time.perf_counter() - t < 60 and not _curves_drawn(drv):
            time.sleep(0.25)
        time.sleep(1.0)
        drv.save_screenshot(str(ART / "removal-curves.png"))
    finally:
        drv.quit()
        srv.stop()
    log = (tmp / "served.log").read_text(errors="replace")
    dash_log = cache / "logs" / "dashboard.log"
    view = [ln for ln in (dash_log.read_text().splitlines() if dash_log.exists() else []) if "live view of job" in ln]
    return {"first_paint_s": first_paint, "cold_s": marks, "server_cpu_s": cpu_srv, "browser_cpu_s": cpu_br,
            "watcher_overflows": log.count("Inotify queue overflowed"), "live_view": view[-1] if view else None,
            "python": srv.python}


def cached_reopen(cache: Path, tmp: Path) -> dict:
    srv = Server(cache, tmp / "reopen.log")
    drv, _ = browser(tmp / "chrome2")
    try:
        drv.get(srv.url)
        wait_for(drv, lambda s: s["title"] and s["compute"], 120, 0.05)
        time.sleep(READ_S)  # a user reads the page before pressing Compute (the server imports torch meanwhile)
        click_compute(drv)
        t0 = time.perf_counter()
        marks: dict = {}

        def seen(s):
            now = time.perf_counter() - t0
            if s["done"] and s["cached"]:
                marks.setdefault("done_s", now)
            if s["plots"] > 0:
                marks.setdefault("figure_s", now)
            return s["done"] and s["cached"] and s["plots"] > 0

        wait_for(drv, seen, 60, 0.02)
        return {"cached_reopen_s": time.perf_counter() - t0, **marks}
    finally:
        drv.quit()
        srv.stop()


def library_cold(python: str, tmp: Path) -> dict:
    cache = fresh_cache("library")
    out = tmp / "library.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", SWAPKL_CACHE=str(cache))
    try:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([python, "-m", "benchmarks.default_cold_cached", "--device", "cpu", "--cold-only",
                        "--cache", str(cache), "--json", str(out)], cwd=ROOT, env=env, check=True)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = json.loads(out.read_text())
        res["process_cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return res
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> int:
    global TICK
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the served cache folder")
    a = ap.parse_args()
    TICK = float(os.sysconf("SC_CLK_TCK"))
    for p in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(p):
            raise SystemExit(f"needs {p}: apt-get install -y chromium chromium-driver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise SystemExit("needs selenium: pip install selenium") from None
    if not (ROOT / "cache" / "models").is_dir():
        print("note: no converted default model in cache/models yet; the served run converts it (not comparable)")
    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f}; project .venv: "
          f"{'yes' if (ROOT / '.venv' / 'bin' / 'python').exists() else 'no'}")
    tmp = Path(tempfile.mkdtemp(prefix="swapkl-served-"))
    cache = fresh_cache("served")
    try:
        s = served_cold(cache, tmp)
        print("served cold (s from Compute): " + ", ".join(f"{k} {v:.1f}" for k, v in s["cold_s"].items())
              + f"; first paint {s['first_paint_s']:.2f} s")
        print(f"  CPU during the run: server process {s['server_cpu_s']:.1f} s, chromium {s['browser_cpu_s']:.1f} s; "
              f"watcher overflows in the server log: {s['watcher_overflows']}; {s['live_view'] or ''}")
        lib = library_cold(s["python"], tmp)
        print("library cold (s from submit): " + ", ".join(f"{k} {v:.1f}" for k, v in lib["cold_s"].items()
                                                          if k != "calibration_forward_16x64")
              + f"; CPU of the whole process (imports, load, job) {lib['process_cpu_s']:.1f} s")
        r = cached_reopen(cache, tmp)
        ratio = s["cold_s"]["done"] / lib["cold_s"]["done"]
        print(f"cached reopen in the browser (Compute -> Done + figure): {r['cached_reopen_s']:.2f} s "
              f"(Done shown {r.get('done_s', float('nan')):.2f} s, first figure {r.get('figure_s', float('nan')):.2f} s)")
        print(f"RATIO served/library cold: {ratio:.3f}  (first pair {s['cold_s']['first_pair'] / lib['cold_s']['first_pair']:.2f}, "
              f"verdict {s['cold_s']['verdict'] / lib['cold_s']['verdict']:.2f})")
        print(f"SUMMARY served cold {s['cold_s']['done']:.1f} s, library cold {lib['cold_s']['done']:.1f} s, "
              f"ratio {ratio:.3f}, cached reopen {r['cached_reopen_s']:.2f} s, first paint {s['first_paint_s']:.2f} s, "
              f"load average at start {load:.2f}, at end {os.getloadavg()[0]:.2f}")
        print(f"screenshots: {ART / 'first-view.png'}, {ART / 'removal-curves.png'}")
        out = {"served": s, "library": lib, "reopen": r, "ratio": ratio, "load_average": load}
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=2))
        return 0
    finally:
        if not a.keep:
            shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
