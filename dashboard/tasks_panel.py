"""The "Task accuracy after removal" panel of the removal-curves page: lm-eval task accuracy of the base model and
each method's pruned model at n = 1..budget (:func:`swapkl.removal.tasks.task_accuracy`), run by the job system
(progress, ETA, cancel), drawn by :mod:`swapkl.views.tasks` (one panel per task and an average, methods overlaid,
stderr bars, chance line), with downloads.

Demo mode: the visitor picks among the operator's allow-listed task names, with a bounded limit; the include path
is the operator's, never typed in a browser (an lm-eval task YAML can run Python; docs/security.md)."""
from __future__ import annotations

import streamlit as st

from dashboard import common
from swapkl.jobs.contents import content_key
from swapkl.jobs.forms import curves_analysis, few_shot, task_list, tasks_request
from swapkl.views import tasks as tv

LOCAL_DEFAULT_TASKS = "tinystories_mc"
LOCAL_DEFAULT_INCLUDE = "tests/fixtures/tasks"


def task_widgets(pol, key: str = "w_tasks") -> tuple[tuple, int | None, int | None, str | None]:
    """(tasks, limit, few-shot, include path) from the widgets (demo: the policy's lists and bounds); ``key``: the
    widgets' key prefix (the Healing panel and the Evidence page ask the same with their own keys)."""
    c1, c2, c3 = st.columns([3, 1, 1])
    if pol.demo:
        tasks = tuple(c1.multiselect("Tasks (this demo server's list)", list(pol.tasks), default=list(pol.tasks[:1]),
                                     key=f"{key}_demo"))
        limit = int(c2.number_input("Documents per task", 1, pol.max_task_limit, min(50, pol.max_task_limit),
                                    key=f"{key}_limit_demo"))
        shots = int(c3.number_input("Few-shot", 0, pol.max_fewshot, 0, key=f"{key}_shots_demo"))
        return tasks, limit, shots, pol.task_include_path
    text = c1.text_input("lm-eval tasks (comma-separated)", LOCAL_DEFAULT_TASKS, key=key,
                         help="hub tasks (hellaswag, arc_easy, piqa, winogrande, lambada_openai: need the hub) or "
                              "tasks from the folder below")
    limit = int(c2.number_input("Documents per task (0 = all)", 0, 10**6, 0, key=f"{key}_limit")) or None
    shots = c3.text_input("Few-shot (empty = task default)", "", key=f"{key}_shots")
    include = st.text_input("Folder of local task YAMLs (your own code: a task YAML can run Python)",
                            LOCAL_DEFAULT_INCLUDE, key=f"{key}_include").strip() or None
    return task_list(text), limit, few_shot(shots), include


def section(analysis_job) -> None:
    """The panel, below the removal curves of ``analysis_job`` (its model, contract, budget and methods)."""
    st.subheader("Task accuracy after removal")
    st.caption("lm-evaluation-harness itself (simple_evaluate on the in-memory pruned models), for the base model "
               "and each method at n = 1..budget.")
    req = curves_analysis(analysis_job)
    if req is None:
        st.info("Start an analysis with a layer budget first: the task accuracy uses its model, contract, budget "
                "and methods.")
        return
    pol = common.policy()
    tasks, limit, shots, include = task_widgets(pol)
    if st.button("Evaluate tasks", key="tasks_start", disabled=not tasks):
        common.start(tasks_request(req, tasks, limit, shots, include))
    job = common.current_job("tasks")
    if job is not None:
        common.live(job, body, "tasks", watch=("tasks",))


def body(job) -> None:
    r = job.tasks
    if r is None or not r.base:
        st.info("The accuracies appear here model by model (the base model first).")
        return
    metrics = list(next(iter(r.base["metrics"].values()), {}))
    default = tv.default_metric(r)
    metric = st.selectbox("Metric (lm-eval's name)", metrics, index=metrics.index(default) if default in metrics
                          else 0, key="w_tasks_metric")
    rk = (content_key(r), metric)
    fig = common.memo("tasks_fig", rk, lambda: tv.tasks_figure(r, metric))
    st.plotly_chart(fig, key="tasks_main")
    table = common.memo("tasks_table", rk, lambda: tv.tasks_table(r, metric))
    st.dataframe(table, hide_index=True, key="tasks_table")
    c = r.contract
    st.caption(f"lm-eval {c.get('lm_eval_version')}; task versions: " + ", ".join(
        f"{t}: {i['versions'].get(t, '?')}" for t, i in c.get("tasks", {}).items())
        + f"; limit {c.get('limit') or 'all'}; error bars: lm-eval's stderr.")
    for note in r.notes:
        st.caption(f"note: {note}")
    if job.running:
        return
    common.downloads(fig, table, fig.layout.meta["contract"], r.to_json(), "task-accuracy", key="tasks")

