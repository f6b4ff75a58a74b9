"""Figure and table of task accuracy after removal (:class:`swapkl.removal.tasks.TasksResult`): one panel per task and
an average panel, accuracy against the number of removed layers n (n = 0 is the base model), every method overlaid
with lm-eval's stderr as error bars and the task's chance accuracy as a dashed line.  Shared by the dashboard and
the report (plotly + pandas; no Streamlit)."""
from __future__ import annotations

import math

from swapkl.removal import methods as M
from swapkl.views.captions import _stamp, contract_caption, fmt_number
from swapkl.views.curves import _style


def _result(r):
    from swapkl.removal.tasks import TasksResult

    return r if isinstance(r, TasksResult) else TasksResult.from_dict(r)


def default_metric(r) -> str | None:
    """``acc_norm,none`` when every task has it, else ``acc,none``, else the first metric of the first task."""
    metrics = list((r.base.get("metrics") or {}).values())
    if not metrics:
        return None
    for m in ("acc_norm,none", "acc,none"):
        if all(m in t for t in metrics):
            return m
    return next(iter(metrics[0]), None)


def _task_rows(r) -> list[str]:
    """The rows to draw: the requested tasks (a group: its own row when lm-eval reports one)."""
    rows = []
    for t in r.tasks():
        if t in r.base.get("metrics", {}):
            rows.append(t)
        else:
            rows += [k for k in r.base.get("metrics", {}) if k not in rows]
    return rows


def series(r, metric: str | None = None) -> dict:
    """``{task or "average": {method: [(n, value, stderr)]}}`` with the base at n = 0 in every method's series.
    The average is over tasks (unweighted), its stderr sqrt(sum stderr^2) / number of tasks (tasks independent)."""
    r = _result(r)
    metric = metric or default_metric(r)
    tasks = _task_rows(r)
    out = {}
    for t in tasks:
        b = (r.base["metrics"].get(t, {}).get(metric), r.base["stderr"].get(t, {}).get(metric))
        out[t] = {}
        for name, entries in r.methods.items():
            pts = [(0, *b)] + [(int(e["n"]), e["metrics"].get(t, {}).get(metric), e["stderr"].get(t, {}).get(metric))
                               for e in entries]
            out[t][name] = [p for p in pts if p[1] is not None]
    if len(tasks) > 1:
        out["average"] = {}
        for name in r.methods:
            by_n: dict = {}
            for t in tasks:
                for n, v, e in out[t].get(name, []):
                    by_n.setdefault(n, []).append((v, e))
            out["average"][name] = [(n, sum(v for v, _ in vs) / len(vs),
                                     math.sqrt(sum(e * e for _, e in vs)) / len(vs) if all(e is not None for _, e in vs)
                                     else None) for n, vs in sorted(by_n.items()) if len(vs) == len(tasks)]
    return out


def chance_of(r, task: str) -> float | None:
    r = _result(r)
    info = r.contract.get("tasks", {}).get(task)
    if info is not None:
        return info.get("chance")
    if task == "average":
        ch = [i.get("chance") for i in r.contract.get("tasks", {}).values()]
        return sum(ch) / len(ch) if ch and all(c is not None for c in ch) else None
    return None


def tasks_figure(r, metric: str | None = None, caption: str | None = None):
    """One panel per task (and "average" when there are several): ``metric`` (lm-eval's name, default
    :func:`default_metric`) against n, methods overlaid with stderr bars, the chance line dashed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    r = _result(r)
    metric = metric or default_metric(r)
    data = series(r, metric)
    panels = list(data)
    cols = min(3, max(1, len(panels)))
    rows = -(-len(panels) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=panels, horizontal_spacing=0.08, vertical_spacing=0.16)
    order = M.run_order(r.methods)
    for i, p in enumerate(panels):
        row, col = i // cols + 1, i % cols + 1
        for k, name in enumerate(order):
            pts = data[p].get(name) or []
            if not pts:
                continue
            st = _style(name, k)
            err = [e if e is not None else 0.0 for _, _, e in pts]
            fig.add_trace(go.Scatter(
                x=[n for n, _, _ in pts], y=[v for _, v, _ in pts], mode="lines+markers",
                error_y={"type": "data", "array": err, "visible": True, "thickness": 1},
                line=st, marker={"color": st["color"]}, name=M.label(name), legendgroup=name, showlegend=i == 0,
                text=[f"n = {n}: {fmt_number(v, 4)} ± {fmt_number(e, 4) if e is not None else '?'}" for n, v, e in pts],
                hovertemplate="%{text}<extra>" + M.label(name) + "</extra>", meta={"method": name, "panel": p}),
                row=row, col=col)
        ch = chance_of(r, p)
        if ch is not None:
            fig.add_hline(y=ch, line={"dash": "dash", "color": "#555", "width": 1}, row=row, col=col,
                          annotation_text=f"chance {fmt_number(ch, 3)}", annotation_font_size=10)
        fig.update_xaxes(dtick=1, title_text="layers removed n", row=row, col=col)
        fig.update_yaxes(title_text=metric, row=row, col=col)
    fig.update_layout(height=360 * rows + 80, width=max(760, 380 * cols), hovermode="closest",
                      meta={"metric": metric, "panels": panels})
    return _stamp(fig, "Task accuracy after removal", caption or contract_caption(r))


def tasks_table(r, metric: str | None = None):
    """pandas table: one row per (method, n) -- the base as n = 0 -- with the removed layers and, per task,
    ``metric`` and its stderr."""
    import pandas as pd

    r = _result(r)
    metric = metric or default_metric(r)
    tasks = _task_rows(r)
    rows = [{"method": "base", "n": 0, "removed": "", **{f"{t} {metric}": r.base["metrics"][t].get(metric)
                                                         for t in tasks},
             **{f"{t} stderr": r.base["stderr"][t].get(metric) for t in tasks}}]
    for name, entries in r.methods.items():
        for e in entries:
            rows.append({"method": name, "n": e["n"],
                         "removed": "mean of seeds" if e["removed"] is None else " ".join(map(str, e["removed"])),
                         **{f"{t} {metric}": e["metrics"].get(t, {}).get(metric) for t in tasks},
                         **{f"{t} stderr": e["stderr"].get(t, {}).get(metric) for t in tasks}})
    return pd.DataFrame(rows)
