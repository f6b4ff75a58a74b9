"""What the AppTest suites share: the app's path, the model they compute on, the run timeout and opening a job on a
page (their ``cache`` fixture, a private cache and a fresh job manager, is in conftest.py)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
STORIES_REL = "tests/fixtures/models/stories260K"
TIMEOUT = 60


def switch_page(at, page: str):
    """``at.switch_page(page)``, where ``"app.py"`` is the Start page: ``app.py``'s navigation's default page, a
    function, which ``AppTest.switch_page`` (files only) cannot name; an empty page request runs the default page,
    as the root URL does.  Returns ``at`` (call ``.run()``)."""
    if page != "app.py":
        return at.switch_page(page)
    at._page_hash = at._finished_page_script_hash = ""  # AppTest's page request; "" = the navigation's default
    return at


def open_job_page(job, page: str):
    """A fresh AppTest session showing ``job`` (analysis and pinned job) on ``page`` (``"pages/…"``), drawn once
    without an exception; returns it."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state["job_analysis"] = job.key
    at.session_state["job_pinned"] = job.key
    at.run()
    at.switch_page(page).run()
    assert not at.exception, at.exception
    return at


def heal_panel_app():
    """A Streamlit app of the heal panel's body for the healed curves in the file ``$SWAPKL_TEST_HEAL``
    (``AppTest.from_function``: self-contained)."""
    import json
    import os

    from dashboard import heal_panel
    from swapkl.healing.curves import HealCurves
    from swapkl.jobs import HealRequest, Job

    job = Job("heal-panel-test", HealRequest())
    job.done_from("test", heal=HealCurves.from_dict(json.loads(open(os.environ["SWAPKL_TEST_HEAL"]).read())))
    heal_panel.body(job)


def wait_export(at, key: str = "export", timeout: float = 180):
    """A demo export's job (the one the button ``key`` submitted) waited for, then the page drawn again; returns
    the job (its ``export`` record says what was written and served)."""
    from dashboard import common

    job = common.manager().get(at.session_state[f"_export_job_{key}"])
    assert job is not None and job.wait(timeout) and job.status == "done", (job and (job.status, job.error))
    at.run()
    assert not at.exception, at.exception
    return job
