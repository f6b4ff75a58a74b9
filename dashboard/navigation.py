"""Every page shows under ``app.py``'s own navigation, also as the first visit of a fresh server.

Why this is needed (Streamlit 1.67, ``streamlit/runtime/pages_manager.py`` and ``scriptrunner/script_runner.py``):
the first browser session of a server process creates a ``PagesManager``, which sets the process-wide class flag
``PagesManager.uses_pages_directory`` to whether a ``pages/`` folder lies beside the main script -- here it does.
While that flag is true, the script runner does not execute ``app.py``: it runs ``_mpa_v1``, the old multipage
mode, which lists every ``.py`` file of ``pages/`` as a page and executes the file the URL names by itself (the
root URL runs ``app.py`` as that list's first page).  Only a call of ``st.navigation`` clears the flag, and
``app.py`` makes that call only when it runs -- on the root URL.  So the first visitor of a fresh server who
followed a link (``/compare?a=..&b=..``) got Streamlit's file list as navigation and the page without ``app.py``
(no page config, no sidebar, no shared widget state); once anyone had opened the root, later links behaved.

Two guards, one flag: :func:`discovery_off` clears the flag before the server takes its first session
(``serve.py``, what ``./run.sh`` starts), so the old mode never runs; :func:`app_navigation` is the first statement
of every page, and when the old mode ran the page file anyway (``streamlit run app.py`` directly; also every run
of ``streamlit.testing``'s ``AppTest``, which resets the flag), it clears the flag and executes the main script,
``app.py``, in the same script run: its ``st.navigation`` resolves the same page (Streamlit keys a page by its URL
path, the same for the discovered file and ``app.py``'s ``st.Page``) with the same query string and widget
values, and runs it; the outer run then stops.  ``app.py`` itself needs no guard: run as the old mode's first page,
its own ``st.navigation`` clears the flag and takes over."""
from __future__ import annotations

import types

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx


def discovery_off() -> None:
    """Turn Streamlit's ``pages/`` folder discovery off for this server process: every script run executes
    ``app.py``, whose ``st.navigation`` lists the pages.  Call before the server starts (``serve.py``)."""
    PagesManager.uses_pages_directory = False


def discovery_on() -> bool:
    """Whether Streamlit still runs pages by folder discovery in this process (the flag ``app.py``'s
    ``st.navigation`` clears)."""
    return bool(getattr(PagesManager, "uses_pages_directory", False))  # a Streamlit without the old mode: off


def app_navigation() -> None:
    """First statement of every page: when Streamlit's folder discovery ran this page file instead of ``app.py``
    (the first visit of a fresh ``streamlit run app.py`` server), turn discovery off, run ``app.py`` -- its
    navigation draws this same page, with this run's query and widget values -- and stop; otherwise nothing."""
    if not discovery_on():
        return
    discovery_off()
    ctx = get_script_run_ctx()
    if ctx is None:  # not in a script run (a bare import): nothing to hand over
        return
    main = ctx.main_script_path
    module = types.ModuleType("__main__")  # as Streamlit executes a script: a fresh __main__ with its __file__
    module.__dict__["__file__"] = main
    exec(ctx.pages_manager.get_page_script_byte_code(main), module.__dict__)  # the app's own entry, as Streamlit runs it
    st.stop()
