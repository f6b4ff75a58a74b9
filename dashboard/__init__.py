"""The dashboard's Streamlit-side helper modules: what the pages of ``pages/`` and ``app.py`` share (gathered by
:mod:`dashboard.common`), the panels of the removal-curves page and the live progress line's script.  They live
beside ``pages/``, not in it: Streamlit lists every file of ``pages/`` as a page of its own when it runs a page
without ``app.py``'s navigation (docs/architecture.md), so that folder holds only the pages ``app.py`` registers."""
