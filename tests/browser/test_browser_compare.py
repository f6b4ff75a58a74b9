"""Real-browser test of the Compare page and the demo bundle: a fresh server with an empty cache opens a bundle and a
score file on the Compare page (no model, no computation), and draws A, B and B − A for both protocols with the
agreement table and the bundle's caption.  Skipped with the standard reason without Chromium / chromedriver /
selenium."""
from __future__ import annotations

import json


from support.browser_util import ARTIFACTS, need_browser, patient_wait, screenshot, upload_and_open

need_browser()

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402



def test_a_bundle_and_a_score_file_open_on_the_compare_page_of_a_fresh_server(fresh_url, browser, tmp_path):
    from swapkl.compare.bundle import make_bundle
    from test_compare import synthetic

    a, b = tmp_path / "a-scores.json", tmp_path / "b-bundle.json"
    synthetic(seed=0, noise=0.05).save(a)
    b.write_text(json.dumps(make_bundle(synthetic(seed=1, noise=0.05), device="a GPU elsewhere")))
    drv, wait = browser, patient_wait(browser)
    drv.get(fresh_url + "/compare")
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(., 'Two finished analyses are needed')]")))
    upload_and_open(drv, wait, "Open score files or bundles", [a, b])
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .heatmaplayer .hm")) >= 6)
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(., 'bundle computed on') and "
                                                         "contains(., 'a GPU elsewhere')]")))
    text = " ".join(e.text for e in drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"))
    assert "B − A" in text and "replacement swap-KL" in text and "interchange swap-KL" in text
    assert "a=" in drv.current_url and "b=" in drv.current_url  # the address bar holds the comparison
    screenshot(drv, ARTIFACTS, "compare.png")
    # clicking a cell of the first heatmap opens the drill-down of that pair (A's and B's per-prompt KLs)
    from selenium.webdriver.common.action_chains import ActionChains

    cell = drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .scatterlayer .point")[0]
    ActionChains(drv).move_to_element(cell).click().perform()
    wait.until(EC.presence_of_element_located((By.XPATH, "//h3[contains(., 'per-prompt swap-KL of A and B')]")))
    assert "pair=" in drv.current_url
    screenshot(drv, ARTIFACTS, "compare-drilldown.png")
