"""The one import of a dashboard page: ``from pages import common`` gives what every page shares, by concern in its
own helper module (this module only gathers them; helper modules never import it, pages and panels do):

* :mod:`pages.session`: this server's policy and job manager, the browser session's id, widget state across pages;
* :mod:`pages.current`: the jobs this session looks at -- current job, start, find;
* :mod:`pages.widgets`: the start page's inputs and the request they make, the shared link;
* :mod:`pages.live_view`: a job's live status and its page's body kept current;
* :mod:`pages.figures`: figures memoised on content, the lead figure;
* :mod:`pages.downloads`, :mod:`pages.export_view`: downloads, the one-click report, exporting a pruned model;
* :mod:`pages.sidebar`: the sidebar.

What pages read from jobs is decided in the library: :mod:`swapkl.jobs.forms` (requests from forms, the request's
contract line), :mod:`swapkl.jobs.contents` (the verdict of a job, content keys), :mod:`swapkl.jobs.reports` (the
result JSON, the report), :mod:`swapkl.jobs.exports` (export formats and names)."""
from __future__ import annotations

from pages.current import current_job, find, need_result, start
from pages.downloads import download_figure, download_json, download_table, downloads, report_button
from pages.export_view import export_view
from pages.figures import lead_figure, memo, result_key
from pages.live_view import live, progress_view
from pages.session import POLL_S, keep_widget_state, manager, policy, session_id, streamlit_session
from pages.sidebar import sidebar
from pages.widgets import request_from_widgets, set_query
from swapkl.jobs.contents import job_verdict
from swapkl.jobs.forms import request_caption
from swapkl.jobs.reports import evidence_done, job_sections, report_html, result_json
from swapkl.views.captions import safe_name

__all__ = ["POLL_S", "current_job", "download_figure", "download_json", "download_table", "downloads",
           "evidence_done", "export_view", "find", "job_sections", "job_verdict", "keep_widget_state", "lead_figure",
           "live", "manager", "memo", "need_result", "policy", "progress_view", "report_button", "report_html",
           "request_caption", "request_from_widgets", "result_json", "result_key", "safe_name", "session_id",
           "set_query", "sidebar", "start", "streamlit_session"]
