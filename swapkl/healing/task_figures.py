"""Figures, table and report blocks of task accuracy after healing (:func:`swapkl.healing.tasks.heal_task_accuracy`'s
result): the task panel's figure (:func:`swapkl.views.tasks.tasks_figure`: one panel per task and an average, the
base at n = 0 and each method's pruned model solid, chance dashed grey) with each method's healed model **dashed**
over it and the fine-tuned base (the control) as a dotted horizontal line; the recipe in the contract caption
(plotly + pandas; torch-free, no Streamlit)."""
from __future__ import annotations

from swapkl.errors import SwapklError
from swapkl.removal import methods as M
from swapkl.views.captions import SEP, contract_caption, fmt_number
from swapkl.views.curves import method_style

FORMAT = "swapkl.heal_tasks/1"  # = swapkl.healing.tasks.FORMAT (that module pulls lm-eval's wrapper)
CONTROL_COLOR = "#222"


def before_and_after(ht: dict) -> tuple[dict, dict]:
    """Two :class:`~swapkl.removal.tasks.TasksResult` dicts of one heal-tasks result: before healing (the base at
    n = 0 and each pruned model) and after (the fine-tuned base at n = 0 and each healed model)."""
    c = dict(ht["contract"])
    c.setdefault("budget", max([int(e["n"]) for v in ht["methods"].values() for e in v] or [1]))

    def result(base, role):
        return {"model": ht.get("model") or {}, "contract": c, "base": base, "complete": True,
                "methods": {m: [{"n": e["n"], "removed": e["removed"], **e[role]} for e in v]
                            for m, v in ht["methods"].items()}}

    return result(ht["base"], "pruned"), result(ht["base_finetuned"], "healed")


def validate_tasks(d, where: str = "heal tasks") -> dict:
    """Refuse (one line) a ``tasks`` block that is not task accuracy after healing with checked tables."""
    from swapkl.schema.tasks import tasks_fields

    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise SwapklError(f"{where}: not task accuracy after healing ({FORMAT})")
    try:
        before, after = before_and_after(d)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise SwapklError(f"{where}: malformed ({type(e).__name__}: {str(e)[:80]})") from None
    tasks_fields(before, f"{where} (before healing)")
    tasks_fields(after, f"{where} (after healing)")
    return d


def heal_task_results(ht):
    from swapkl.removal.tasks import TasksResult

    before, after = before_and_after(ht)
    return TasksResult.from_dict(before), TasksResult.from_dict(after)


def caption(ht) -> str:
    """The task contract caption (lm-eval version, task versions, limit, few-shot) and the recipe."""
    import dataclasses

    before, _ = heal_task_results(ht)
    prov = dataclasses.replace(before.provenance(), evaluator=ht["contract"].get("evaluator"))
    return f"{contract_caption(prov)}{SEP}healed: {ht['contract'].get('recipe_line', '?')}"


def heal_tasks_figure(ht, metric: str | None = None):
    """The task panel's figure before healing, with per panel: each method's healed model dashed (``meta``:
    method, panel, kind ``healed``; lm-eval's stderr as error bars) and the fine-tuned base as a dotted line
    (kind ``base_finetuned``)."""
    import plotly.graph_objects as go

    from swapkl.views.tasks import default_metric, series, tasks_figure

    before, after = heal_task_results(ht)
    metric = metric or default_metric(before)
    fig = tasks_figure(before, metric, caption=caption(ht))
    fig.update_layout(title={"text": "Task accuracy before healing (solid) and after (dashed)"})
    healed = series(after, metric)
    ns = [int(e["n"]) for v in after.methods.values() for e in v]
    xs = [0, max(ns or [1])]
    for i, panel in enumerate(fig.layout.meta["panels"]):
        ax = "" if i == 0 else str(i + 1)
        for k, name in enumerate(M.run_order(after.methods)):
            pts = [p for p in healed.get(panel, {}).get(name, []) if p[0] >= 1]  # n = 0 is the control: its line
            if not pts:
                continue
            st = method_style(name, k)
            fig.add_trace(go.Scatter(
                x=[n for n, _, _ in pts], y=[v for _, v, _ in pts], mode="lines+markers", xaxis=f"x{ax}",
                yaxis=f"y{ax}", error_y={"type": "data", "array": [e or 0.0 for _, _, e in pts], "thickness": 1},
                line={"color": st["color"], "width": 2, "dash": "dash"}, marker={"symbol": "diamond"},
                name=f"{M.label(name)} healed", legendgroup=f"{name}-healed", showlegend=i == 0,
                text=[f"healed, n = {n}: {fmt_number(v, 4)} ± {fmt_number(e, 4)}" for n, v, e in pts],
                hovertemplate="%{text}<extra>" + M.label(name) + "</extra>",
                meta={"method": name, "panel": panel, "kind": "healed"}))
        ctrl = next((p for pts in healed.get(panel, {}).values() for p in pts if p[0] == 0), None)
        if ctrl is not None:
            fig.add_trace(go.Scatter(
                x=xs, y=[ctrl[1]] * 2, mode="lines", xaxis=f"x{ax}", yaxis=f"y{ax}",
                line={"color": CONTROL_COLOR, "width": 1.5, "dash": "dot"}, name="fine-tuned base (control)",
                legendgroup="control", showlegend=i == 0, hovertemplate=f"fine-tuned base {fmt_number(ctrl[1], 4)}"
                f" ± {fmt_number(ctrl[2], 4)}<extra></extra>", meta={"panel": panel, "kind": "base_finetuned"}))
    meta = dict(fig.layout.meta)
    fig.update_layout(meta=dict(meta, healed=ht["contract"].get("recipe_line")))
    return fig


def heal_tasks_table(ht, metrics=None):
    """pandas table: the base and the fine-tuned base, then one row per method and n with, per task and metric
    (default: every metric), the value before healing (the raw cut), the bridged model's after ``--repair bridge``
    (columns ``… bridged``) and the value after healing, each with lm-eval's stderr."""
    import pandas as pd

    from swapkl.views.tasks import task_rows, all_metrics

    before, after = heal_task_results(ht)
    metrics = list(metrics or all_metrics(before))
    tasks = task_rows(before)

    def cells(rows, label):
        return {f"{t} {m}{label}{s}": (rows[tab].get(t) or {}).get(m) for t in tasks for m in metrics
                for tab, s in (("metrics", ""), ("stderr", " stderr"))}

    out = [{"model": "base", "n": 0, "removed": "", **cells(ht["base"], "")},
           {"model": "fine-tuned base (control)", "n": 0, "removed": "", **cells(ht["base_finetuned"], "")}]
    for m in M.run_order(ht["methods"]):
        for e in ht["methods"][m]:
            out.append({"model": M.label(m), "n": e["n"], "removed": " ".join(map(str, e["removed"])),
                        **cells(e["pruned"], " before healing"),
                        **(cells(e["bridged"], " bridged") if e.get("bridged") else {}), **cells(e["healed"], " healed")})
    return pd.DataFrame(out)


def blocks_and_figures(ht) -> tuple[list, list]:
    """What the healing report section adds for task accuracy: (HTML blocks, figures), one figure per metric the
    task report draws (acc and acc_norm where every task has both)."""
    from swapkl.views.captions import csv_link, html_table, html_text
    from swapkl.views.tasks import figure_metrics

    before, _ = heal_task_results(ht)
    cap = caption(ht)
    table = heal_tasks_table(ht)
    c = ht["contract"]
    blocks = ["<h3>Task accuracy after healing</h3>",
              f"<p>lm-evaluation-harness {html_text(c.get('lm_eval_version'))} on the base, the fine-tuned base "
              "(the control: the same recipe on the same text, no layer removed), each pruned model (before healing, "
              "solid) and each healed model (the heal's adapter merged: the model whose perplexity is reported above; "
              f"dashed), limit {html_text(c.get('limit') or 'all')}, few-shot "
              f"{html_text(c.get('num_fewshot') if c.get('num_fewshot') is not None else 'task default')}. "
              "Error bars: lm-eval's stderr.</p>",
              html_table(table, cap), csv_link(table, cap, "healed_task_accuracy.csv", "download CSV")]
    return blocks, [heal_tasks_figure(ht, m) for m in figure_metrics(before)]
