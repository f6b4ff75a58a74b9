"""A room of visitors: K headless Chromium sessions open a served dashboard within a few seconds of each other,
keep (or set) their settings and press Compute, while the server's health and memory are watched.

Shared by ``tests/browser/test_visitors.py`` (stories260K, K = 4) and ``benchmarks/visitors.py`` (the default, K = 1, 4, 8).
Needs Debian's chromium + chromium-driver and selenium.  Sends traffic only to the loopback server it drives."""
from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from support.browser_util import chrome, click_clear

# the page's state in one cheap script call (no XPath over the whole document: the drivers' polling must not
# load the machine they measure)
STATUS_JS = """
const alerts = [...document.querySelectorAll('[data-testid="stAlertContainer"]')].map(e => e.textContent);
const live = [...document.querySelectorAll('*')].filter(e => e.shadowRoot)
  .map(e => e.shadowRoot.querySelector('.swapkl-live .txt')).filter(Boolean).map(t => t.textContent);
return {
  title: [...document.querySelectorAll('h1')].some(h => h.textContent.includes('protocol-aware layer redundancy')),
  compute: [...document.querySelectorAll('button')].some(b => b.textContent.trim() === 'Compute'),
  done: alerts.find(t => t.includes('Done:')) || null,
  cancelled: alerts.find(t => t.trim().startsWith('Cancelled')) || null,
  error: alerts.find(t => t.trim().startsWith('Error:')) || null,
  refused: alerts.find(t => /queued or running|server is busy|not allowed|at most/.test(t)) || null,
  live: live.join(' | '),
};
"""


def click_button(drv, text: str) -> None:
    from selenium.webdriver.common.by import By

    click_clear(drv, lambda: drv.find_element(By.XPATH, f"//button[.//p[normalize-space(.)='{text}']]"))


@dataclass
class Visitor:
    """One browser session's story: what it saw and when (seconds from the room's start)."""
    name: str
    setup: object = None            # callable(driver) run after first paint, before Compute (set a contract)
    leave_after_s: float | None = None  # close the browser this long after pressing Compute
    query: str = ""                 # a shared link's query string, e.g. "?budget=2"
    expect: str = ""                # text of this visitor's own job in its "Done:" line (a fresh session first
                                    # shows the server's last analysis, which may be another contract's)
    opened: float | None = None
    clicked: float | None = None
    done: float | None = None
    left: float | None = None
    error: str | None = None
    lines: list = field(default_factory=list)  # distinct live-line texts seen (queue place, progress)

    def run(self, url: str, profile: Path, start: list, delay: float, timeout: float, ready: threading.Barrier):
        drv = None
        try:
            drv = chrome(profile, size="1400,1000")
            ready.wait(timeout=180)
            t0 = start[0]  # set by the barrier's action: the moment every browser was up
            time.sleep(delay)
            drv.get(url + "/" + self.query)
            self._until(drv, lambda s: s["title"] and s["compute"], 120)
            self.opened = time.perf_counter() - t0
            if self.setup is not None:
                self.setup(drv)
            click_button(drv, "Compute")
            self.clicked = time.perf_counter() - t0
            deadline = time.perf_counter() + timeout
            while True:
                s = drv.execute_script(STATUS_JS)
                if s["live"] and (not self.lines or self.lines[-1] != s["live"]):
                    self.lines.append(s["live"])
                if s["error"] or s["refused"] or s["cancelled"]:
                    self.error = s["error"] or s["refused"] or s["cancelled"]
                    return
                if s["done"] and self.expect in s["done"]:
                    self.done = time.perf_counter() - t0
                    return
                if self.leave_after_s is not None and time.perf_counter() - t0 - self.clicked >= self.leave_after_s:
                    drv.quit()
                    drv = None
                    self.left = time.perf_counter() - t0
                    return
                if time.perf_counter() > deadline:
                    self.error = f"timed out; page said {s}"
                    return
                time.sleep(0.5)
        except Exception as e:  # a visitor's failure is its result, the others go on
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            if drv is not None:
                drv.quit()

    @staticmethod
    def _until(drv, cond, timeout: float) -> dict:
        deadline = time.perf_counter() + timeout
        while True:
            s = drv.execute_script(STATUS_JS)
            if cond(s):
                return s
            if s["error"]:
                raise RuntimeError(s["error"])
            if time.perf_counter() > deadline:
                raise TimeoutError(f"page status {s}")
            time.sleep(0.1)


class Watch:
    """Polls ``/_stcore/health`` every ``every`` s (latency of each answer, a failure counts as its timeout)
    and the resident memory of the server's process tree, on a daemon thread until :meth:`stop`.

    A control server -- a trivial HTTP server in a process of its own, doing nothing else -- is polled right
    after each health poll: when it is slow too, the machine itself was stalled (a loaded 2-core machine,
    other processes), not the dashboard.  ``slow_server_only`` counts the health answers over ``limit_s`` whose
    control answer was fast (under ``limit_s / 2``): the dashboard's own stalls."""

    def __init__(self, url: str, pid: int, every: float = 0.25, timeout: float = 5.0, limit_s: float = 1.0):
        self.url, self.pid, self.every, self.timeout, self.limit_s = url, pid, every, timeout, limit_s
        self.latencies: list[float] = []
        self.control: list[float] = []
        self.at: list[float] = []  # seconds from the start of each poll
        self._t0 = time.perf_counter()
        self.failures = 0
        self.peak_rss_mb = 0.0
        self._ctl = control_server()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True, name="watch")
        self._t.start()

    def _get(self, url: str) -> tuple[bool, float]:
        t = time.perf_counter()
        try:
            ok = urllib.request.urlopen(url, timeout=self.timeout).read().strip() in (b"ok", b"control")
        except OSError:
            ok = False
        return ok, time.perf_counter() - t

    def _loop(self):
        while not self._stop.is_set():
            self.at.append(time.perf_counter() - self._t0)
            ok, dt = self._get(self.url + "/_stcore/health")
            self.latencies.append(dt)
            self.control.append(self._get(self._ctl[1])[1])
            self.failures += not ok
            self.peak_rss_mb = max(self.peak_rss_mb, tree_rss_mb(self.pid))
            self._stop.wait(max(0.0, self.every - dt))

    def stop(self) -> dict:
        self._stop.set()
        self._t.join(10)
        self._ctl[0].kill()
        lat = self.latencies or [float("nan")]
        slow = [(round(t, 1), round(h, 2), round(c, 2)) for t, h, c in zip(self.at, self.latencies, self.control)
                if h >= self.limit_s]
        own = sum(1 for _, h, c in slow if c < self.limit_s / 2)
        return {"health_median_s": statistics.median(lat), "health_max_s": max(lat), "health_polls": len(lat),
                "health_failures": self.failures, "control_max_s": max(self.control or [float("nan")]),
                "slow_server_only": own, "slow_polls": slow, "peak_rss_mb": round(self.peak_rss_mb, 1)}


CONTROL = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"control")
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def control_server():
    """A do-nothing HTTP server on loopback in its own process: ``(process, url)``."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", CONTROL], stdout=subprocess.PIPE, text=True)
    return p, f"http://127.0.0.1:{int(p.stdout.readline())}/"


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (MB), from /proc."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for ln in Path(f"/proc/{p}/status").read_text().splitlines():
                if ln.startswith("VmRSS:"):
                    total += int(ln.split()[1])
            for f in Path(f"/proc/{p}/task").glob("*/children"):
                todo += [int(k) for k in f.read_text().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


def computations(log_path: Path) -> int:
    """Jobs the server actually ran (the job manager logs one 'started' line per computation)."""
    try:
        return sum(" started: " in ln for ln in Path(log_path).read_text(encoding="utf-8").splitlines())
    except OSError:
        return 0


def room(url: str, pid: int, visitors: list[Visitor], tmp: Path, spread_s: float = 4.0,
         timeout: float = 600) -> dict:
    """Let ``visitors`` in: every browser is started first, then they open the page ``spread_s`` seconds apart in
    all (a room arriving together) and press Compute.  Returns the health/memory figures and the wall time from
    the first page open to the last Done."""
    watch = Watch(url, pid)
    t0 = [0.0]
    ready = threading.Barrier(len(visitors) + 1, action=lambda: t0.__setitem__(0, time.perf_counter()))
    threads = []
    step = spread_s / max(1, len(visitors) - 1)
    for k, v in enumerate(visitors):
        th = threading.Thread(target=lambda v=v, k=k: v.run(url, tmp / f"chrome-{k}", t0, k * step, timeout, ready),
                              daemon=True)
        th.start()
        threads.append(th)
    ready.wait(timeout=180)
    for th in threads:
        th.join(timeout + 300)
    figures = watch.stop()
    dones = [v.done for v in visitors if v.done is not None]
    figures["last_done_s"] = max(dones) if dones else None
    return figures
