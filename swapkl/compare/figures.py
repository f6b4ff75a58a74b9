"""The Compare page's figures and tables (plotly and pandas, no Streamlit): per protocol A and B side by side on one
colour scale with B − A on a diverging one (heatmaps, or depth profiles when only adjacent pairs were scored), the
agreement table and the transfer table.  Every figure carries the comparison's contract caption."""
from __future__ import annotations

import numpy as np

from swapkl.compare.agreement import matrix
from swapkl.scoring.results import matrix_json
from swapkl.views.captions import stamp, contract_caption, fmt_number
from swapkl.views.links import add_cell_markers
from swapkl.views.scores import is_adjacent_only, layer_axes


def _label(res, side: str) -> str:
    ident = res.identity or {}
    return f"{side}: {ident.get('display') or ident.get('id') or '?'}"


def side_by_side(a, b, protocol: str, caption: str | None = None):
    """A, B and B − A of ``protocol`` (nats): three heatmaps (A and B on one colour scale, B − A centred on 0), or
    for adjacent-only results one depth profile of A and B and one of B − A.  ``caption``: the contract line."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ma, mb = matrix(a, protocol), matrix(b, protocol)
    diff = mb - ma
    L = a.num_layers
    title = f"{protocol} swap-KL: A and B side by side, and B − A"
    if is_adjacent_only(a) or is_adjacent_only(b):
        x = [i + 0.5 for i in range(L - 1)]
        ya, yb = [ma[i, i + 1] for i in range(L - 1)], [mb[i, i + 1] for i in range(L - 1)]
        fig = make_subplots(rows=1, cols=2, subplot_titles=("A and B (adjacent pairs)", "B − A"))
        for name, y, dash in ((_label(a, "A"), ya, "solid"), (_label(b, "B"), yb, "dash")):
            fig.add_trace(go.Scatter(x=x, y=matrix_json([y])[0], mode="lines+markers", name=name,
                                     line={"dash": dash}, customdata=[[i, i + 1] for i in range(L - 1)],
                                     hovertemplate="pair (%{customdata[0]}, %{customdata[1]}): %{y:.4g} nats"),
                          row=1, col=1)
        fig.add_trace(go.Bar(x=x, y=matrix_json([np.array(yb) - np.array(ya)])[0], name="B − A",
                             customdata=[[i, i + 1] for i in range(L - 1)],
                             hovertemplate="pair (%{customdata[0]}, %{customdata[1]}): %{y:+.4g} nats"), row=1, col=2)
        fig.update_xaxes(title_text="depth (between layers i and i+1)")
        fig.update_yaxes(title_text="nats", row=1, col=1)
        fig.update_layout(height=420, width=980)
        return stamp(fig, title, caption or contract_caption(a))
    vals = np.concatenate([ma[np.isfinite(ma)], mb[np.isfinite(mb)]])
    lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
    span = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 1.0
    axis = list(range(L))
    fig = make_subplots(rows=1, cols=3, subplot_titles=(_label(a, "A"), _label(b, "B"), "B − A"),
                        horizontal_spacing=0.06)
    for col, m, ax in ((1, ma, "coloraxis"), (2, mb, "coloraxis"), (3, diff, "coloraxis2")):
        fig.add_trace(go.Heatmap(z=matrix_json(m), x=axis, y=axis, coloraxis=ax, xgap=1, ygap=1,
                                 name=("A", "B", "B − A")[col - 1],
                                 hovertemplate="pair (%{y}, %{x}): %{z:.4g} nats<extra>%{fullData.name}</extra>"),
                      row=1, col=col)
    add_cell_markers(fig)  # clickable cells: a transparent marker per scored cell (customdata [i, j])
    fig.update_layout(coloraxis={"colorscale": "Viridis", "cmin": lo, "cmax": max(hi, lo + 1e-9),
                                 "colorbar": {"title": {"text": "nats"}, "x": 0.64}},
                      coloraxis2={"colorscale": "RdBu_r", "cmin": -max(span, 1e-9), "cmax": max(span, 1e-9),
                                  "colorbar": {"title": {"text": "B − A"}}},
                      height=420, width=1200, plot_bgcolor="white")
    for col in (1, 2, 3):
        layer_axes(fig, L, row=1, col=col)
    return stamp(fig, title, caption or contract_caption(a), extra_top=18)


def _ci_text(c: dict) -> str:
    lo, hi = c.get("ci") or (None, None)
    return f"{fmt_number(c.get('value'), 3)} [{fmt_number(lo, 3)}, {fmt_number(hi, 3)}]"


def agreement_rows(cmp) -> list[dict]:
    """One row per protocol: Spearman and Kendall with their CIs, the pairs both scored, each model's verdict."""
    ag = cmp.agreement
    v = ag.get("verdicts") or {}
    rows = []
    for p in ("replacement", "interchange"):
        rows.append({"protocol": p, "pairs": len(ag[p].get("pairs") or []),
                     "Spearman ρ [95% CI]": _ci_text(ag[p]["spearman"]), "Kendall τ [95% CI]": _ci_text(ag[p]["kendall"]),
                     "verdict A": (v.get("a") or {}).get("regime") or "–",
                     "verdict B": (v.get("b") or {}).get("regime") or "–"})
    return rows


def transfer_rows(cmp) -> list[dict]:
    """One row per protocol and n: A's set and B's own set on B, their ΔPPL %, the paired difference and word."""
    rows = []
    for p, entries in ((cmp.transfer or {}).get("protocols") or {}).items():
        for r in entries:
            rows.append({"protocol": p, "n": r["n"], "set chosen on A": str(r["set_a"]),
                         "ΔPPL % on B": fmt_number(r.get("delta_a"), 2), "set chosen on B": str(r["set_b"]),
                         "ΔPPL % (B's own)": fmt_number(r.get("delta_b"), 2),
                         "A − B [95% CI]": f"{fmt_number(r['diff'], 2)} [{fmt_number(r['ci'][0], 2)}, "
                                           f"{fmt_number(r['ci'][1], 2)}]", "verdict": r["word"]})
    return rows
