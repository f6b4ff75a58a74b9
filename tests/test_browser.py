"""Real-browser end-to-end test: ``streamlit run app.py`` headless, driven by Debian's chromium through selenium.

Picks ../shared/models/stories260K on the Start page, computes, waits for both heatmaps (Heatmaps page) and the
removal-curves chart (Removal curves page), and saves screenshots under ``artifacts/browser/`` (git-ignored).
Skipped with a reason when chromium / chromedriver / selenium are missing (CI's ``.ci/run`` installs them)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = ROOT / "artifacts" / "browser"

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}): "
                "apt-get install -y chromium chromium-driver", allow_module_level=True)
selenium = pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium)")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path, stories_path):
    port = _free_port()
    env = dict(os.environ, SWAPKL_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1",
               STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = open(tmp_path / "streamlit.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read().strip() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            break
    else:
        proc.kill()
        pytest.fail("streamlit did not start: " + (tmp_path / "streamlit.log").read_text()[-2000:])
    if proc.poll() is not None:
        pytest.fail("streamlit exited: " + (tmp_path / "streamlit.log").read_text()[-2000:])
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-extensions", "--disable-sync",
              "--no-first-run", "--window-size=1600,1200", f"--user-data-dir={tmp_path / 'chrome'}"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def _click_text(drv, wait, text: str, tag: str = "*"):
    el = wait.until(EC.element_to_be_clickable((By.XPATH, f"//{tag}[normalize-space(.)='{text}']")))
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    el.click()
    return el


def _set_number(drv, wait, label: str, value: int):
    el = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, f"input[aria-label='{label}']")))
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(str(value), Keys.ENTER)
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"input[aria-label='{label}']").get_attribute("value")
               == str(value))


def _screenshot(drv, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p = ARTIFACTS / name
    drv.save_screenshot(str(p))
    return p


def test_browser_end_to_end(server, browser):
    drv, wait = browser, WebDriverWait(browser, 60)
    drv.get(server + "/")
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(., 'protocol-aware layer redundancy')]")))
    # pick the stories260K folder: "Local folder", whose first option is ../shared/models/stories260K
    _click_text(drv, wait, "Local folder", "p")
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(text(), 'stories260K')]")))
    time.sleep(0.5)
    _set_number(drv, wait, "Prompts P", 4)
    _set_number(drv, wait, "Tokens T per prompt", 16)
    _set_number(drv, wait, "Layer budget (0 = no curves)", 2)
    wait.until(EC.presence_of_element_located(
        (By.XPATH, "//code[contains(., 'stories260K') and contains(., '4 prompts × 16 tokens')]")))
    _click_text(drv, wait, "Compute", "p")
    # live progress (a progress bar with a Cancel button, polled by a fragment), then the summary
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid='stProgress']")
               or d.find_elements(By.XPATH, "//*[contains(text(), 'Done:')]"))
    WebDriverWait(drv, 400, poll_frequency=1).until(
        EC.presence_of_element_located((By.XPATH, "//*[contains(text(), 'Done:')]")))
    wait.until(EC.presence_of_element_located((By.XPATH, "//h3[contains(., 'prefer')]")))
    _screenshot(drv, "start.png")

    # Heatmaps page: both protocol heatmaps (two heatmap traces in the first chart) and the gap heatmap
    _click_text(drv, wait, "Heatmaps", "span")
    WebDriverWait(drv, 90).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) >= 3)
    WebDriverWait(drv, 60).until(lambda d: len(d.find_elements(
        By.CSS_SELECTOR, ".js-plotly-plot .heatmaplayer .hm")) >= 3)
    first = drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")[0]
    assert len(first.find_elements(By.CSS_SELECTOR, ".heatmaplayer .hm")) == 2
    assert "interchange d_inter" in first.text
    _screenshot(drv, "heatmaps.png")

    # Removal curves page: the ΔPPL chart with the two guided curves
    _click_text(drv, wait, "Removal curves", "span")
    WebDriverWait(drv, 90).until(lambda d: any("ΔPPL after layer removal" in e.text
                                               for e in d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")))
    chart = [e for e in drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot") if "ΔPPL" in e.text][0]
    assert "replacement-guided" in chart.text and "interchange-guided" in chart.text
    shot = _screenshot(drv, "curves.png")
    assert shot.stat().st_size > 10_000
