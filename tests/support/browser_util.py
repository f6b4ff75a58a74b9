"""Helpers shared by the tests that serve the app and drive Debian's Chromium (selenium): a free port, a
streamlit server that is waited for and always stopped, a headless browser, and small waits."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"  # screenshots (git-ignored)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
HAVE_BROWSER = os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def need_browser():
    """Skip the calling module without Chromium, chromedriver or selenium (CI's .ci/run installs them)."""
    if not HAVE_BROWSER:
        pytest.skip(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): "
                    "apt-get install -y chromium chromium-driver", allow_module_level=True)
    pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium)")


#: the ports free_port draws from: below the kernel's ephemeral range (32768-60999 on Linux), so no outgoing
#: connection takes one between the probe and the server's bind; one slice per pytest-xdist worker
PORTS, PORTS_PER_WORKER = range(20000, 32000), 750


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on, for a server the caller starts next.  Drawn at random from this
    pytest-xdist worker's own slice of :data:`PORTS` (gw0: 20000-20749, gw1: 20750-21499, ...; outside xdist the
    whole range), so two workers never pick the same port between one's probe and its server's bind -- and a test
    never reaches a neighbour's server on "its" port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    ports = PORTS
    if worker.startswith("gw") and worker[2:].isdigit():
        start = PORTS.start + PORTS_PER_WORKER * (int(worker[2:]) % (len(PORTS) // PORTS_PER_WORKER))
        ports = range(start, start + PORTS_PER_WORKER)
    for port in random.sample(ports, len(ports)):  # every port of the slice, in random order
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports}")


@contextlib.contextmanager
def served(cmd: list[str], cwd: Path, env: dict, log_path: Path, port: int, timeout: float = 120):
    """Run ``cmd`` (a streamlit server on ``port``) in its own process group, wait until /_stcore/health says
    ok, yield ``(url, proc)``, then stop the whole group."""
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited ({proc.returncode}):\n{Path(log_path).read_text()[-3000:]}")
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read().strip() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
            if time.time() > deadline:
                pytest.fail("the server did not start:\n" + Path(log_path).read_text()[-3000:])
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def streamlit_cmd(port: int, *extra: str) -> list[str]:
    """The server as ``./run.sh`` starts it (``serve.py``: ``streamlit run app.py`` after the heavy imports)."""
    return [sys.executable, "serve.py", "--server.port", str(port), *extra]


def chrome(user_data_dir: Path, size: str = "1600,1200"):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
              "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-extensions", f"--window-size={size}", f"--user-data-dir={user_data_dir}"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(90)
    return drv


def _retry_stale(fn, tries: int = 5):
    """Run ``fn()``, again when Streamlit redrew the element between finding and using it (a rerun after each
    input change replaces the widget's DOM node)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for k in range(tries):
        try:
            return fn()
        except StaleElementReferenceException:
            if k == tries - 1:
                raise
            time.sleep(0.3)


def click_clear(drv, find, seconds: float = 60):
    """Click the element ``find()`` returns, scrolled to the middle of the window first; again (found afresh) while
    Streamlit redraws it (stale), another element still covers it (a block being laid out, a toast) or it cannot take
    the click yet (not interactable: seen once on a loaded machine, the Compare page's Open button just after its
    files were shown), until ``seconds`` have passed.  Returns the element clicked."""
    from selenium.common.exceptions import (ElementClickInterceptedException, ElementNotInteractableException,
                                            StaleElementReferenceException)

    deadline = time.time() + seconds
    while True:
        try:
            el = find()
            drv.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
            el.click()
            return el
        except (ElementClickInterceptedException, ElementNotInteractableException, StaleElementReferenceException):
            if time.time() > deadline:
                raise
            time.sleep(0.3)


def click_text(drv, wait, text: str, tag: str = "*"):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    return click_clear(drv, lambda: wait.until(
        EC.element_to_be_clickable((By.XPATH, f"//{tag}[normalize-space(.)='{text}']"))))


def set_number(drv, wait, label: str, value: int):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC

    def go():
        el = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, f"input[aria-label='{label}']")))
        drv.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
        el.send_keys(Keys.CONTROL, "a")
        el.send_keys(str(value), Keys.ENTER)

    _retry_stale(go)
    wait.until(lambda d: _retry_stale(lambda: d.find_element(
        By.CSS_SELECTOR, f"input[aria-label='{label}']").get_attribute("value")) == str(value))


def screenshot(drv, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    drv.save_screenshot(str(p))
    return p


def listening_addresses(port: int) -> list[str]:
    """Local addresses of the sockets LISTENing on ``port`` (IPv4 and IPv6), read from /proc/net/tcp{,6}:
    e.g. ``["127.0.0.1"]``.  Reads the kernel's socket table; sends no traffic."""
    out = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            addr, p = f[1].split(":")
            if int(p, 16) != port or f[3] != "0A":  # 0A = LISTEN
                continue
            raw = bytes.fromhex(addr)
            if width == 8:
                out.append(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:  # four little-endian 32-bit words
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                out.append(socket.inet_ntop(socket.AF_INET6, words))
    return out


@contextlib.contextmanager
def fresh_server(tmp_path: Path, **env: str):
    """``streamlit run app.py`` of this tree on a free port, offline, with an empty cache under ``tmp_path`` (and
    ``env`` added to the environment); yields its URL and always stops it."""
    port = free_port()
    full = dict(os.environ, SWAPKL_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", **env)
    with served(streamlit_cmd(port), ROOT, full, tmp_path / "streamlit.log", port, timeout=90) as (url, _):
        yield url


@contextlib.contextmanager
def chrome_session(tmp_path: Path):
    """A headless Chromium with its profile under ``tmp_path``; always quit."""
    drv = chrome(tmp_path / "chrome")
    try:
        yield drv
    finally:
        drv.quit()


def patient_wait(drv, seconds: float = 60):
    """A ``WebDriverWait`` that retries through stale elements (Streamlit redraws them under the test)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, seconds, ignored_exceptions=(StaleElementReferenceException,))


def upload_and_open(drv, wait, expander: str, files: list[Path]) -> None:
    """Open the expander whose label contains ``expander``, give its file box ``files`` and press Open, once
    the last file's name is shown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    click_clear(drv, lambda: wait.until(EC.presence_of_element_located((By.XPATH, f"//*[contains(text(), '{expander}')]"))))
    box = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "input[type=file]")))
    box.send_keys("\n".join(str(f) for f in files))
    wait.until(EC.presence_of_element_located((By.XPATH, f"//*[contains(text(), '{Path(files[-1]).name}')]")))
    click_clear(drv, lambda: wait.until(EC.element_to_be_clickable((By.XPATH, "//button[.//p[text()='Open']]"))))
