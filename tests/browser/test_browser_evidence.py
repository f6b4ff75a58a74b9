"""Real-browser test of the Evidence page: the app served as ``./run.sh`` serves it (``serve.py``), Debian's Chromium
(selenium) opens the Evidence page, types the stories260K folder, a small budget and bootstrap, runs the evidence
job and waits until the three figures are drawn with data (the agreement heatmap, the ground-truth bars, the
stability strip) and the headline and contract caption are on screen.  Screenshot: ``artifacts/browser/evidence.png``.
Skipped with a reason when chromium / chromedriver / selenium are missing."""
from __future__ import annotations

import time

import pytest

from support.browser_util import ARTIFACTS, click_text, fresh_server, need_browser, screenshot, set_number

need_browser()

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from support.app_util import STORIES_REL  # noqa: E402

STALE = (StaleElementReferenceException,)

# per chart: its title, heatmap images, bars and scatter points drawn (plotly's SVG/canvas layers)
CHARTS_JS = """return [...document.querySelectorAll('.js-plotly-plot')].map(p => ({
  title: (p.querySelector('.gtitle') || {}).textContent || '',
  hm: p.querySelectorAll('.heatmaplayer .hm image').length,
  bars: p.querySelectorAll('.barlayer .point').length,
  points: p.querySelectorAll('.scatterlayer .point').length}));"""


@pytest.fixture
def server(tmp_path, stories_path, wikitext_path):
    # a corpus of 11,000 words (the server's automatic corpus): one evaluation region of 5,000 words (the matched
    # evaluator), no second region, a prompt region for prompts and calibration -- the job stays short
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(open(wikitext_path, encoding="utf-8").read().split()[:11000]), encoding="utf-8")
    with fresh_server(tmp_path, SWAPKL_CORPUS=str(corpus)) as url:
        yield url


def _type(drv, wait, label: str, text: str) -> None:
    el = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, f"input[aria-label='{label}']")))
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(text, Keys.ENTER)


def test_evidence_page_draws_three_figures(server, browser):
    drv, wait = browser, WebDriverWait(browser, 60, ignored_exceptions=STALE)
    t0 = time.time()
    drv.get(server + "/evidence")
    wait.until(EC.presence_of_element_located((By.XPATH, "//h1[contains(., 'Evidence')]")))
    _type(drv, wait, "Checkpoint", STORIES_REL)
    set_number(drv, wait, "budget n (stability for 1..n)", 2)
    set_number(drv, wait, "bootstrap B", 20)
    wait.until(EC.presence_of_element_located(
        (By.XPATH, "//code[contains(., 'stories260K') and contains(., 'budget 2') and contains(., 'B=20')]")))
    click_text(drv, wait, "Compute evidence", "p")

    def drawn(d):
        charts = d.execute_script(CHARTS_JS)
        return charts if len(charts) >= 3 and all(c["hm"] or c["bars"] for c in charts[:3]) else None

    charts = WebDriverWait(drv, 240, poll_frequency=1, ignored_exceptions=STALE).until(drawn)
    agree, bars, strip = charts[:3]
    assert agree["title"].startswith("Rank agreement") and agree["hm"] >= 1
    assert bars["title"].startswith("Ground truth per layer") and bars["bars"] == 5  # one bar per layer
    assert bars["points"] >= 5  # the signals' ranks overlaid
    assert strip["title"].startswith("Stability") and strip["hm"] >= 1
    head = wait.until(EC.presence_of_element_located((By.XPATH, "//strong[starts-with(., 'on this checkpoint ')]")))
    assert "predicts single-layer removal cost (held-out ΔPPL) best" in head.text
    cap = drv.find_element(By.XPATH, "//*[starts-with(normalize-space(.), 'contract: ') and contains(., 'stories260K')"
                                     " and not(*[starts-with(normalize-space(.), 'contract: ')])]")
    assert "evaluator matched" in cap.text
    assert drv.find_elements(By.XPATH, "//strong[normalize-space(.)='Sets.']")  # the set-level agreement
    screenshot(drv, ARTIFACTS, "evidence.png")
    assert "evaluation words 0-5000" in cap.text and "evaluation_2" not in cap.text  # the short corpus
    print(f"evidence page: drawn in {time.time() - t0:.0f} s")  # a figure for the log, not a limit
