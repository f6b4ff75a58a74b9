"""Figure and table of task accuracy after removal (:class:`swapkl.removal.tasks.TasksResult`): one panel per task and
an average panel, accuracy against the number of removed layers n (n = 0 is the base model), every method overlaid
with lm-eval's stderr as error bars and the task's chance accuracy as a dashed line.  Shared by the dashboard and
the report (plotly + pandas; no Streamlit)."""
from __future__ import annotations

import math

from swapkl.removal import methods as M
from swapkl.views.captions import stamp, contract_caption, fmt_number
from swapkl.views.curves import method_style


def _result(r):
    from swapkl.removal.tasks import TasksResult

    return r if isinstance(r, TasksResult) else TasksResult.from_dict(r)


def load_tasks(obj, what: str = "tasks file"):
    """A :class:`~swapkl.removal.tasks.TasksResult` from a TasksResult, its ``to_dict()``, or a path to a
    ``swapkl tasks --json`` file, checked by :func:`swapkl.schema.tasks.tasks_fields` (one-line
    :class:`~swapkl.errors.UploadError` naming the field)."""
    from swapkl import schema
    from swapkl.removal.tasks import TasksResult
    from swapkl.schema.tasks import tasks_fields

    if isinstance(obj, TasksResult):
        return obj
    d = obj if isinstance(obj, dict) else schema.read_json_file(obj, what, keep_constants=True)
    return TasksResult.from_dict(tasks_fields(d, what if isinstance(obj, dict) else f"{what} {obj}"))


def default_metric(r) -> str | None:
    """``acc_norm,none`` when every task has it, else ``acc,none``, else the first metric of the first task."""
    metrics = list((r.base.get("metrics") or {}).values())
    if not metrics:
        return None
    for m in ("acc_norm,none", "acc,none"):
        if all(m in t for t in metrics):
            return m
    return next(iter(metrics[0]), None)


def task_rows(r) -> list[str]:
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
    tasks = task_rows(r)
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
            st = method_style(name, k)
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
    return stamp(fig, "Task accuracy after removal", caption or contract_caption(r))


def all_metrics(r) -> list[str]:
    """Every metric of the base model's rows, in lm-eval's order (``acc,none``, ``acc_norm,none``, ...)."""
    r = _result(r)
    return list(dict.fromkeys(m for row in (r.base.get("metrics") or {}).values() for m in row))


def _removed_text(e: dict) -> str:
    if e["removed"] is None:
        return f"mean of {e.get('n_seeds') or len(e.get('per_seed') or []) or '?'} seeds"
    return " ".join(map(str, e["removed"])) + (f" ({e['merge']})" if e.get("merge") else "")


def tasks_table(r, metric: str | None = None, metrics=None):
    """pandas table: one row per (method, n) -- the base as n = 0 -- with the removed layers and, per task and
    metric (``metrics``, else ``metric``, else :func:`default_metric`), the value and lm-eval's stderr (columns
    ``"<task> <metric>"`` and ``"<task> <metric> stderr"``)."""
    import pandas as pd

    r = _result(r)
    metrics = list(metrics or [metric or default_metric(r)])
    tasks = task_rows(r)

    def cells(e):
        out = {}
        for t in tasks:
            for m in metrics:
                out[f"{t} {m}"] = (e["metrics"].get(t) or {}).get(m)
                out[f"{t} {m} stderr"] = (e["stderr"].get(t) or {}).get(m)
        return out

    rows = [{"method": "base", "n": 0, "removed": "", **cells(r.base)}]
    for name, entries in r.methods.items():
        rows += [{"method": name, "n": e["n"], "removed": _removed_text(e), **cells(e)} for e in entries]
    return pd.DataFrame(rows)


def seeds_table(r, metrics=None):
    """pandas table of a seeded method's (random's) seeds: method, n, seed, removed, each metric per task."""
    import pandas as pd

    r = _result(r)
    metrics = list(metrics or all_metrics(r))
    tasks = task_rows(r)
    rows = []
    for name, entries in r.methods.items():
        for e in entries:
            for s in e.get("per_seed") or []:
                rows.append({"method": name, "n": e["n"], "seed": s["seed"], "removed": " ".join(map(str, s["removed"])),
                             **{f"{t} {m}": (s["metrics"].get(t) or {}).get(m) for t in tasks for m in metrics}})
    return pd.DataFrame(rows)


def markdown_table(r, metric: str | None = None, nd: int = 3) -> str:
    """The table a closing note quotes: one row per task and method (base first), one column per n = 0..N, each
    cell ``value ± stderr`` (``metric``, default :func:`default_metric`); the contract caption below."""
    r = _result(r)
    metric = metric or default_metric(r)
    budget = max([int(e["n"]) for es in r.methods.values() for e in es] or [0])
    out = []
    for t in task_rows(r):
        out += [f"{t}, {metric} (± lm-eval stderr; n = layers removed)", "",
                "| method | " + " | ".join(f"n = {n}" for n in range(budget + 1)) + " |",
                "|---|" + "---:|" * (budget + 1)]

        def cell(e, t=t):
            v, s = (e["metrics"].get(t) or {}).get(metric), (e["stderr"].get(t) or {}).get(metric)
            return "–" if v is None else f"{v:.{nd}f}" + ("" if s is None else f" ± {s:.{nd}f}")

        base = cell(r.base)
        out.append(f"| base | {base} |" + " |" * budget)
        for name in M.run_order(r.methods):
            by_n = {int(e["n"]): e for e in r.methods[name]}
            sets = ", ".join(f"n={n}: " + ("mean of seeds" if e["removed"] is None else str(e["removed"]))
                             for n, e in sorted(by_n.items()))
            row = [base] + [cell(by_n[n]) if n in by_n else "" for n in range(1, budget + 1)]
            out.append(f"| {M.label(name)} ({sets}) | " + " | ".join(row) + " |")
        out.append("")
    out.append(f"contract: {contract_caption(r)}")
    return "\n".join(out)


def figure_metrics(r) -> list[str]:
    """The metrics the report draws, one figure each: acc and acc_norm where every task has them (papers mix the
    two up), else :func:`default_metric`."""
    r = _result(r)
    rows = [r.base["metrics"].get(t) or {} for t in task_rows(r)]
    both = [m for m in ("acc,none", "acc_norm,none") if rows and all(m in row for row in rows)]
    return both or [m for m in [default_metric(r)] if m]


def _contract_items(r) -> list[tuple[str, str]]:
    from swapkl.views.captions import html_text

    c = r.contract
    items = [("evaluator", html_text(c.get("evaluator") or "lm-eval")),
             ("lm-eval version", html_text(c.get("lm_eval_version")))]
    samples = c.get("n-samples") or {}
    for t, info in (c.get("tasks") or {}).items():
        ns = samples.get(t) or {}
        docs = f"{ns.get('effective')} of {ns.get('original')} documents" if ns else "documents: ?"
        types = ", ".join(sorted({str(v) for v in (info.get("output_types") or {}).values()})) or "?"
        items.append((f"task {t}", html_text(f"versions {info.get('versions')}; {types}; {docs}; chance "
                                             f"{fmt_number(info.get('chance'), 4)}; config sha "
                                             f"{info.get('config_sha', '?')}")))
    items += [("metrics (lm-eval's names)", html_text(", ".join(all_metrics(r)))),
              ("limit", html_text(c.get("limit") or "all documents")),
              ("few-shot", html_text(c.get("num_fewshot") if c.get("num_fewshot") is not None else
                                     f"task default (ran: {c.get('n-shot') or '?'})")),
              ("batch size", html_text(c.get("batch_size"))),
              ("selection", html_text(c.get("selection") or {}))]
    return items


def section(r):
    """The HTML report's "Task accuracy after removal" :class:`~swapkl.views.report.Section`: one figure per
    :func:`figure_metrics` metric (a panel per task and an average, methods overlaid, stderr bars, chance line), the
    table of every metric with its stderr (and each seed of a seeded method), CSV links, and the contract."""
    from swapkl.views.captions import csv_link, html_kv_table, html_table, html_text
    from swapkl.views.report import Section  # deferred: the report module pulls every other view

    r = _result(r)
    cap = contract_caption(r)
    shown = figure_metrics(r)
    table = tasks_table(r, metrics=all_metrics(r))
    intro = (f"<p>Task accuracy of the base model (n = 0) and of each method's pruned model at n = 1..N, computed "
             f"by lm-evaluation-harness {html_text(r.contract.get('lm_eval_version'))} itself (simple_evaluate on an "
             "HFLM around the in-memory pruned model). Error bars: lm-eval's stderr; dashed line: chance accuracy. "
             f"One figure per metric ({html_text(', '.join(shown))}): acc and acc_norm are different numbers.</p>"
             + html_kv_table(_contract_items(r)))
    blocks = ["<h3>Every metric, with lm-eval's stderr</h3>", html_table(table, cap),
              csv_link(table, cap, "task_accuracy.csv", "download CSV")]
    seeds = seeds_table(r)
    if len(seeds):
        blocks += ["<h3>Seeded methods: each seed's set</h3><p>The rows above are the mean over these seeds (stderr: "
                   "the mean of the seeds' stderrs).</p>", html_table(seeds, cap),
                   csv_link(seeds, cap, "task_accuracy_seeds.csv", "download CSV")]
    if not r.complete:
        blocks.append('<p class="note">note: the run was stopped before every model was evaluated.</p>')
    blocks += [f'<p class="note">note: {html_text(n)}</p>' for n in r.notes]
    figs = tuple(tasks_figure(r, m, caption=cap) for m in shown)
    return Section("Task accuracy after removal", intro, figs, tuple(blocks))
