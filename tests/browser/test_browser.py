"""Real-browser end-to-end test: ``streamlit run app.py`` headless, driven by Debian's chromium through selenium.

Picks tests/fixtures/models/stories260K on the Start page, computes, waits for both heatmaps (Heatmaps page) and the
removal-curves chart (Removal curves page), and saves screenshots under ``artifacts/browser/`` (git-ignored).
Skipped with a reason when chromium / chromedriver / selenium are missing (CI's ``.ci/run`` installs them)."""
from __future__ import annotations

import time

import pytest

from support.browser_util import ARTIFACTS, click_text, fresh_server, need_browser, screenshot, set_number

need_browser()

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException  # noqa: E402

STALE = (StaleElementReferenceException,)

LIVE_TEXT_JS = """return [...document.querySelectorAll('*')].filter(e => e.shadowRoot)
  .map(e => e.shadowRoot.querySelector('.swapkl-live .txt')).filter(Boolean).map(t => t.textContent);"""


@pytest.fixture
def server(tmp_path, stories_path):
    with fresh_server(tmp_path) as url:
        yield url


def test_browser_end_to_end(server, browser):
    drv, wait = browser, WebDriverWait(browser, 60)
    drv.get(server + "/")
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(., 'protocol-aware layer redundancy')]")))
    # pick the stories260K folder: "Local folder", whose first option is tests/fixtures/models/stories260K (SWAPKL_MODEL_DIRS)
    click_text(drv, wait, "Local folder", "p")
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(text(), 'stories260K')]")))
    time.sleep(0.5)
    # enough work (a few seconds) that the live line is seen to move before Done, now that the server has
    # imported everything a job needs before the click
    set_number(drv, wait, "Prompts P", 256)
    set_number(drv, wait, "Tokens T per prompt", 256)
    set_number(drv, wait, "Layer budget (0 = no curves)", 2)
    want = "//code[contains(., 'stories260K') and contains(., '256 prompts × 256 tokens')]"
    try:  # the contract line follows the inputs after the page's rerun (slow when other tests load the machine)
        WebDriverWait(drv, 120).until(EC.presence_of_element_located((By.XPATH, want)))
    except TimeoutException:
        screenshot(drv, ARTIFACTS, "start-contract.png")
        shown = [e.text for e in drv.find_elements(By.TAG_NAME, "code")]
        pytest.fail(f"the contract line never read stories260K, 256 prompts × 256 tokens; it read {shown}")
    click_text(drv, wait, "Compute", "p")
    # live progress: the browser-side line (in the component's shadow root) polls the job's progress file and
    # its text moves on while the job runs, with a Cancel button beside it; then the summary
    seen: list[str] = []
    deadline = time.time() + 400
    while not drv.find_elements(By.XPATH, "//*[contains(text(), 'Done:')]"):
        seen += [t for t in drv.execute_script(LIVE_TEXT_JS) if t and (not seen or seen[-1] != t)]
        assert time.time() < deadline, f"no Done; live line said {seen[-3:]}"
        time.sleep(0.5)
    assert len(set(seen)) >= 2 and all(t.startswith(("step ", "queued")) for t in seen), seen
    wait.until(EC.presence_of_element_located((By.XPATH, "//h3[contains(., 'prefer')]")))
    screenshot(drv, ARTIFACTS, "start.png")

    # Heatmaps page: both protocol heatmaps (two heatmap traces in the first chart) and the gap heatmap
    click_text(drv, wait, "Heatmaps", "span")
    # Streamlit may redraw a chart between two lookups: a stale element is retried, not a failure
    WebDriverWait(drv, 90, ignored_exceptions=STALE).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) >= 3)
    WebDriverWait(drv, 60, ignored_exceptions=STALE).until(lambda d: len(d.find_elements(
        By.CSS_SELECTOR, ".js-plotly-plot .heatmaplayer .hm")) >= 3)

    def first_chart(d):
        first = d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")[0]
        return (len(first.find_elements(By.CSS_SELECTOR, ".heatmaplayer .hm")), first.text)

    hm, text = WebDriverWait(drv, 30, ignored_exceptions=STALE).until(first_chart)
    assert hm == 2
    assert "interchange d_inter" in text
    screenshot(drv, ARTIFACTS, "heatmaps.png")

    # Removal curves page: the ΔPPL chart with the two guided curves
    click_text(drv, wait, "Removal curves", "span")
    def curves_text(d):
        return next((e.text for e in d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
                     if "ΔPPL after layer removal" in e.text), None)

    text = WebDriverWait(drv, 90, ignored_exceptions=STALE).until(curves_text)
    assert "replacement-guided" in text and "interchange-guided" in text
    shot = screenshot(drv, ARTIFACTS, "curves.png")
    assert shot.stat().st_size > 10_000
