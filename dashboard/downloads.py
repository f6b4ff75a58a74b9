"""Downloads: a figure (HTML), a table (CSV with its contract), a result (JSON), a panel's three side by side, and
the one-click report of what this session has (:func:`swapkl.jobs.reports.report_html`)."""
from __future__ import annotations

import json

import streamlit as st

from dashboard.current import current_job
from dashboard.session import policy
from swapkl import views
from swapkl.jobs.reports import bundle_json, evidence_done, report_html
from swapkl.views.captions import safe_name


def download_figure(fig, name: str, key: str) -> None:
    st.download_button(f"⬇ {name} (HTML)", data=lambda: views.figure_html(fig), file_name=f"{safe_name(name)}.html",
                       mime="text/html", key=key, on_click="ignore")


def download_table(df, caption, name: str, key: str) -> None:
    st.download_button(f"⬇ {name} (CSV)", data=views.table_csv(df, caption), file_name=f"{safe_name(name)}.csv",
                       mime="text/csv", key=key, on_click="ignore")


def download_json(obj_json: dict | str, name: str, key: str) -> None:
    data = obj_json if isinstance(obj_json, str) else json.dumps(obj_json, indent=1, allow_nan=False, default=str)
    st.download_button(f"⬇ {name} (JSON)", data=data, file_name=f"{safe_name(name)}.json",
                       mime="application/json", key=key, on_click="ignore")


def downloads(fig, table, caption, obj_json: dict | str, name: str, key: str) -> None:
    """A panel's downloads side by side: its figure (HTML), table (CSV with the contract) and result (JSON)."""
    st.markdown("**Downloads** (each carries its contract)")
    for col, (part, draw, args) in zip(st.columns(3), (("figure", download_figure, (fig, name)),
                                                     ("table", download_table, (table, caption, name)),
                                                     ("json", download_json, (obj_json, name)))):
        with col:
            draw(*args, key=f"dl_{key}_{part}")


def report_button(key: str) -> None:
    """Offer the demo report of the current analysis (and trajectory, evidence, healing, task accuracy, when the
    session has them) as a download."""
    job, traj = current_job("analysis"), current_job("trajectory")
    ev, heal, tasks = current_job("evidence"), current_job("heal"), current_job("tasks")
    have = (job is not None and job.result is not None) or (traj is not None and traj.trajectory is not None) \
        or evidence_done(ev)
    if not have:
        return
    st.download_button("⬇ Demo report (HTML)", data=lambda: report_html(job, traj, ev, heal, tasks),
                       file_name="swapkl-report.html",
                       mime="text/html", key=key, on_click="ignore",
                       help="one self-contained HTML page: verdict, heatmaps, curves, trajectory, contract")
    if job is not None and job.result is not None and not job.running:
        st.download_button("⬇ Demo bundle (JSON)", data=lambda: bundle_json(job, ev, heal, tasks, public=policy().demo),
                           file_name="swapkl-bundle.json", mime="application/json", key=f"{key}_bundle",
                           on_click="ignore", help="every finished result of this analysis in one file, which "
                           "another swapkl dashboard opens with no model and no computation (docs/compare.md)")
