"""Pages run under ``app.py``'s navigation even when Streamlit's ``pages/`` folder discovery runs the page file by
itself (dashboard/navigation.py), without a browser: ``streamlit.testing``'s ``AppTest`` resets Streamlit's
discovery flag before every run, so each of its runs of a page is what a fresh server's first visit to that
page's address was.  The browser proof, one fresh server per address: tests/browser/test_browser_first_visit.py."""
from __future__ import annotations

import pytest
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

from support.app_util import APP, TIMEOUT

#: each page file, its heading
PAGES = [("pages/heatmaps.py", "Heatmaps"), ("pages/curves.py", "Removal curves"),
         ("pages/trajectory.py", "Training trajectory"), ("pages/evidence.py", "Evidence"), ("pages/compare.py", "Compare"), ("pages/study.py", "Study")]


@pytest.mark.parametrize("page,heading", PAGES)
def test_a_discovered_page_run_is_handed_to_app_navigation(cache, page, heading):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    at.query_params["a"], at.query_params["b"] = "job-a", "job-b"
    at.switch_page(page).run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == [heading]  # the page, drawn once
    # app.py ran: its sidebar (the old mode runs the page file alone, with an empty sidebar)
    assert "none yet — start one on the Start page" in [c.value for c in at.sidebar.caption]
    assert at.query_params["a"] == "job-a" and at.query_params["b"] == "job-b"  # the query kept through the hand-over
    assert PagesManager.uses_pages_directory is False  # the run cleared Streamlit's discovery
