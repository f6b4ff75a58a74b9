"""A study's figures and its HTML-report section (plotly and pandas, no Streamlit): the grid (one row per model),
the I/R ratio per n as small multiples across models (one panel per model, paired 95 % CIs, 1 = parity), the
predictor validity -- Spearman ρ of each protocol with single-block removal cost -- per model as a dot plot with
CIs, and with tasks each guided set's accuracy change per n as small multiples.  Every figure and table carries the
study's contract caption."""
from __future__ import annotations

import math

from swapkl.schema.text import plain_text
from swapkl.study.across import rank_agreement, row_tasks, statements, study_tasks, table_rows
from swapkl.study.measure import PROTOCOLS
from swapkl.views.captions import stamp, contract_caption, csv_link, html_table, html_text
from swapkl.views.report import Section

COLORS = {"replacement": "#1f77b4", "interchange": "#d62728", "consensus-mean": "#2ca02c",
          "consensus-max": "#9467bd"}
#: pixels per model row of the ρ dot plot, per row of panels of the small multiples, and the band kept free for
#: subplot titles between the caption and the plot area
ROW_PX, PANEL_PX, TITLE_BAND = 70, 260, 36


def _clear(fig, plot_px: int):
    """Title and contract caption pinned to the top of the figure, the top margin grown by :data:`TITLE_BAND` so
    subplot titles sit below the caption, and the height = margins + ``plot_px`` (grows with the models)."""
    top = fig.layout.margin.t + TITLE_BAND
    height = top + plot_px + 90
    fig.update_layout(height=height, margin={"t": top},
                      title={"yref": "container", "y": 1 - 8 / height, "yanchor": "top"})
    return fig


def grid(result):
    """The table across models (:func:`swapkl.study.across.table_rows`) as a DataFrame, columns in first-seen
    order (rows without a column hold None)."""
    import pandas as pd

    rows = table_rows(result)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)


def _label(row) -> str:
    """A row's model label as a figure draws it: plain text (plotly would draw a label's ``<a href>`` as a link)."""
    return plain_text(row["model"]["label"])


def _err(ci, v):
    if not ci or ci[0] is None or ci[1] is None or v is None:
        return 0.0, 0.0
    return max(v - ci[0], 0.0), max(ci[1] - v, 0.0)


def ratio_multiples(result, caption: str | None = None):
    """One panel per finished model: I/R (ΔPPL %(I) / ΔPPL %(R)) at each n with its paired CI; the dotted line at
    1 is parity (below: interchange-guided removal is cheaper)."""
    import plotly.graph_objects as go

    done = result.done()
    fig, cols, nrows = _panels(done)
    for k, r in enumerate(done):
        rows = [x for x in r["removal"]["rows"] if x["ratio"] is not None]
        ns, ys = [x["n"] for x in rows], [x["ratio"] for x in rows]
        lo, hi = zip(*[_err(x["ratio_ci"], x["ratio"]) for x in rows]) if rows else ((), ())
        fig.add_trace(go.Scatter(x=ns, y=ys, mode="lines+markers", name=_label(r), showlegend=False,
                                 error_y={"type": "data", "symmetric": False, "array": list(hi),
                                          "arrayminus": list(lo)},
                                 hovertemplate="n=%{x}: I/R %{y:.3f}<extra>" + html_text(_label(r))
                                               + "</extra>"),
                      row=k // cols + 1, col=k % cols + 1)
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=k // cols + 1, col=k % cols + 1)
        top = max(ns) if ns else 1
        fig.update_xaxes(tickmode="array", tickvals=list(range(1, top + 1)), range=[0.5, top + 0.5],
                         row=k // cols + 1, col=k % cols + 1)
    fig.update_xaxes(title_text="n removed blocks", row=nrows)
    fig.update_yaxes(title_text="I/R (ΔPPL ratio)", col=1)
    stamp(fig, "Interchange / replacement ΔPPL ratio per n (paired 95 % CI; below 1: interchange cheaper)",
          caption if caption is not None else contract_caption(result.provenance()))
    return _clear(fig, PANEL_PX * nrows)


def _panels(done):
    """``(figure, cols, nrows)``: one panel per finished model, at most four to a row, subplot titles the labels."""
    from plotly.subplots import make_subplots

    cols = min(4, max(1, len(done)))
    nrows = max(1, math.ceil(len(done) / cols))
    return make_subplots(rows=nrows, cols=cols, subplot_titles=[_label(r) for r in done] or [""],
                         shared_yaxes=True), cols, nrows


def task_multiples(result, task: str, caption: str | None = None):
    """One panel per finished model with tasks: each guided method's accuracy change on ``task`` (pruned − base,
    accuracy points) at n = 1..budget with its paired per-document 95 % CI; methods side by side at each n, the
    dotted line at 0 is the base model."""
    import plotly.graph_objects as go

    done = [r for r in result.done() if task in row_tasks(r)]
    fig, cols, nrows = _panels(done)
    methods = list(dict.fromkeys(m for r in done for m in r["tasks"]["methods"]))
    for k, r in enumerate(done):
        at = {"row": k // cols + 1, "col": k % cols + 1}
        for j, m in enumerate(methods):
            entries = [e for e in r["tasks"]["methods"].get(m, []) if task in e["delta"]]
            d = [e["delta"][task] for e in entries]
            ys = [100 * x["delta"] for x in d]
            lo, hi = zip(*[_err([100 * c for c in x["ci"]], y) for x, y in zip(d, ys)]) if d else ((), ())
            off = (j - (len(methods) - 1) / 2) * 0.12
            fig.add_trace(go.Scatter(x=[e["n"] + off for e in entries], y=ys, mode="markers", name=m,
                                     legendgroup=m, showlegend=k == 0, marker={"color": COLORS.get(m), "size": 8},
                                     customdata=[[e["n"], ", ".join(map(str, e["removed"]))] for e in entries],
                                     error_y={"type": "data", "symmetric": False, "array": list(hi),
                                              "arrayminus": list(lo)},
                                     hovertemplate="n=%{customdata[0]} {%{customdata[1]}}: %{y:+.1f} points<extra>"
                                                   + m + "</extra>"), **at)
        fig.add_hline(y=0.0, line_dash="dot", line_color="grey", **at)
        top = max((e["n"] for es in r["tasks"]["methods"].values() for e in es), default=1)
        fig.update_xaxes(tickmode="array", tickvals=list(range(1, top + 1)), range=[0.5, top + 0.5], **at)
    fig.update_xaxes(title_text="n removed blocks", row=nrows)
    fig.update_yaxes(title_text="ΔAcc (points)", col=1)
    stamp(fig, f"{task}: ΔAcc of each guided set per n (pruned − base; 95 % CI)",
          caption if caption is not None else contract_caption(result.provenance()))
    return _clear(fig, PANEL_PX * nrows)


def rho_dots(result, caption: str | None = None, part: str = "raw"):
    """Per finished model (y) and protocol (colour): Spearman ρ with single-block held-out ΔPPL % and its 95 % CI;
    ``part`` ``"raw"`` or ``"bridged"`` (after each block's bridge)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = [r for r in result.done() if (r.get("evidence") or {}).get(part)]
    labels = [_label(r) for r in rows]
    for p in PROTOCOLS:
        vals = [r["evidence"][part][p] for r in rows]
        lo, hi = zip(*[_err(v["ci"], v["rho"]) for v in vals]) if vals else ((), ())
        fig.add_trace(go.Scatter(x=[v["rho"] for v in vals], y=labels, mode="markers", name=p,
                                 marker={"color": COLORS[p], "size": 10},
                                 error_x={"type": "data", "symmetric": False, "array": list(hi),
                                          "arrayminus": list(lo)},
                                 hovertemplate="%{y}: ρ %{x:.3f}<extra>" + p + "</extra>"))
    fig.add_vline(x=0.0, line_dash="dot", line_color="grey")
    fig.update_xaxes(title_text="Spearman ρ with single-block removal cost (held-out ΔPPL %)", range=[-1.05, 1.05])
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=labels[::-1])
    what = "after the bridge" if part == "bridged" else "raw"
    stamp(fig, f"Which protocol predicts removal cost ({what}): ρ per model with 95 % CIs",
          caption if caption is not None else contract_caption(result.provenance()))
    return _clear(fig, ROW_PX * max(1, len(rows)) + 40)


def figures(result) -> dict:
    """The study's figures by name: ``ratio``, ``rho``, (with a bridge) ``rho_bridged`` and (with tasks) one
    ``acc_TASK`` per task."""
    cap = contract_caption(result.provenance())
    out = {"ratio": ratio_multiples(result, cap), "rho": rho_dots(result, cap)}
    if any((r.get("evidence") or {}).get("bridged") for r in result.done()):
        out["rho_bridged"] = rho_dots(result, cap, "bridged")
    for t in study_tasks(result.done()):
        out[f"acc_{t}"] = task_multiples(result, t, cap)
    return out


def agreement_frame(result):
    import pandas as pd

    rows = [{"model A": a["a"], "model B": a["b"], "layers": a["layers"],
             **{f"ρ {p}": a[p]["rho"] for p in PROTOCOLS},
             **{f"ρ {p} CI": (f"[{a[p]['ci'][0]:.2f}, {a[p]['ci'][1]:.2f}]" if a[p]["ci"][0] is not None else "")
                for p in PROTOCOLS}} for a in rank_agreement(result)]
    return pd.DataFrame(rows)


def section(result, title: str = "Study across models") -> Section:
    """The report section of a study: the statements, the grid, the two figures, the rank agreement of models of
    one depth and the paper's figures beside this study's where they exist."""
    from swapkl.study.presets import against_paper

    cap = contract_caption(result.provenance())
    g = grid(result)
    intro = ("<ul>" + "".join(f"<li>{html_text(s)}</li>" for s in statements(result)) + "</ul>"
             + f'<p class="caption">contract: {html_text(cap)}</p>')
    blocks = ["<h3>The table</h3>", html_table(g, cap, nd=3), csv_link(g, cap, "study.csv", "download CSV")]
    ag = agreement_frame(result)
    if len(ag):
        blocks += ["<h3>Rank agreement of layer orderings (models of one depth)</h3>", html_table(ag, cap, nd=3)]
    paper = against_paper(result)
    if paper:
        import pandas as pd

        blocks += ["<h3>Against the paper's figures</h3>", html_table(pd.DataFrame(paper).astype(str), cap)]
    blocks += [f'<p class="note">note: {html_text(n)}</p>' for n in result.notes]
    figs = figures(result)
    return Section(title=title, intro=intro, figures=tuple(figs.values()), blocks=tuple(blocks))
