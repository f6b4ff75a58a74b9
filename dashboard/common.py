"""The one import of a dashboard page: ``from dashboard import common`` gives what every page shares, by concern in its
own helper module (this module only gathers them; helper modules never import it, pages and panels do):

* :mod:`dashboard.session`: this server's policy and job manager, the browser session's id, widget state across pages;
* :mod:`dashboard.current`: the jobs this session looks at -- current job, start, find;
* :mod:`dashboard.widgets`: the start page's inputs and the request they make, the shared link, the repair choice;
* :mod:`dashboard.live_view`: a job's live status and its page's body kept current;
* :mod:`dashboard.figures`: figures memoised on content, the lead figure;
* :mod:`dashboard.downloads`, :mod:`dashboard.export_view`: downloads, the one-click report, exporting a pruned model;
* :mod:`dashboard.uploads`: uploaded files -- the server's size limit first, each content parsed once per session;
* :mod:`dashboard.sidebar`: the sidebar;
* :mod:`dashboard.navigation`: every page under ``app.py``'s navigation, first visits of a fresh server included.

What pages read from jobs is decided in the library: :mod:`swapkl.jobs.forms` (requests from forms, the request's
contract line), :mod:`swapkl.jobs.contents` (the verdict of a job, content keys), :mod:`swapkl.jobs.reports` (the
result JSON, the report), :mod:`swapkl.jobs.exports` (export formats and names)."""
from __future__ import annotations

from dashboard.current import current_job, find, need_result, start
from dashboard.downloads import download_figure, download_json, download_table, downloads, report_button
from dashboard.export_view import export_healed_view, export_view
from dashboard.figures import lead_figure, memo, result_key
from dashboard.live_view import live, progress_view
from dashboard.navigation import app_navigation
from dashboard.session import POLL_S, keep_widget_state, manager, policy, session_id, streamlit_session
from dashboard.sidebar import sidebar
from dashboard.uploads import checked as checked_upload, parsed as parsed_upload
from dashboard.widgets import repair_widgets, request_from_widgets, set_query
from swapkl.jobs.contents import job_verdict
from swapkl.jobs.forms import request_caption
from swapkl.jobs.reports import evidence_done, job_sections, report_html, result_json
from swapkl.views.captions import safe_name

__all__ = ["POLL_S", "app_navigation", "current_job", "download_figure", "download_json", "download_table", "downloads",
           "checked_upload", "evidence_done", "export_healed_view", "export_view", "find", "job_sections", "job_verdict", "keep_widget_state", "lead_figure",
           "live", "manager", "memo", "need_result", "parsed_upload", "policy", "progress_view", "repair_widgets", "report_button", "report_html",
           "request_caption", "request_from_widgets", "result_json", "result_key", "safe_name", "session_id",
           "set_query", "sidebar", "start", "streamlit_session"]
