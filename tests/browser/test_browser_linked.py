"""Real-browser test of the linked views on the main pages: a score file opened on the Start page of a fresh server,
then on the Heatmaps page a click on a heatmap cell opens the pair drill-down on that cell's pair (its pickers and the
address bar's ``pair=``).  Skipped with the standard reason without Chromium / chromedriver / selenium."""
from __future__ import annotations

from support.browser_util import ARTIFACTS, click_text, need_browser, patient_wait, screenshot, upload_and_open

need_browser()

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402



def test_clicking_a_heatmap_cell_opens_its_drill_down(fresh_url, browser, tmp_path):
    from test_compare import synthetic

    L = 6
    f = tmp_path / "scores.json"
    synthetic(L=L, seed=0, noise=0.05).save(f)
    drv, wait = browser, patient_wait(browser)
    drv.get(fresh_url)
    upload_and_open(drv, wait, "Open saved results", [f])
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .heatmaplayer .hm"))
    click_text(drv, wait, "Heatmaps", "span")  # the navigation keeps the session (and its opened file)
    wait.until(EC.presence_of_element_located((By.XPATH, "//h3[contains(., 'Pair drill-down')]")))
    wait.until(lambda d: "pair=0-1" in d.current_url)  # no click yet: the first pair
    # the first figure's first clickable trace holds its cells row by row: row 0 has L-1 cells, then (1,0),(1,2),(1,3)
    k = (L - 1) + 2
    cell = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .scatterlayer .trace .point")[k])
    ActionChains(drv).move_to_element(cell).click().perform()
    wait.until(lambda d: "pair=1-3" in d.current_url)
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(text(), 'R[1][3]')]")))
    screenshot(drv, ARTIFACTS, "heatmaps-drilldown.png")


def test_clicking_a_removal_curve_point_marks_its_layers(fresh_url, browser, tmp_path):
    import json

    from swapkl.compare.bundle import make_bundle
    from test_bundle import _curves
    from test_compare import synthetic

    f = tmp_path / "bundle.json"
    curves = _curves()
    f.write_text(json.dumps(make_bundle(synthetic(seed=0, noise=0.05), curves)))
    drv, wait = browser, patient_wait(browser)
    drv.get(fresh_url)
    upload_and_open(drv, wait, "Open saved results", [f])
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .heatmaplayer .hm"))
    click_text(drv, wait, "Removal curves", "span")
    wait.until(EC.presence_of_element_located((By.XPATH, "//*[contains(text(), 'Click a point of a removal curve')]")))
    # the only method's line (its band is drawn without points): its second point is n = 2
    entry = curves.methods["interchange"][1]
    point = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")[0]
                       .find_elements(By.CSS_SELECTOR, ".scatterlayer .trace .point")[1])
    ActionChains(drv).move_to_element(point).click().perform()
    sentence = "interchange-guided removal at n = 2 removes layers {" + ", ".join(map(str, entry["removed"])) + "}"
    wait.until(EC.presence_of_element_located((By.XPATH, f"//*[contains(text(), '{sentence}')]")))
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")[1]
                             .find_elements(By.CSS_SELECTOR, ".heatmaplayer .hm")) == 2)
    marks = drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")[1].find_elements(By.CSS_SELECTOR, ".shapelayer path")
    assert len(marks) >= 4 * len(entry["removed"])  # a row and a column band per layer on each heatmap
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'});",
                       drv.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")[1])
    screenshot(drv, ARTIFACTS, "curves-marked-layers.png")
