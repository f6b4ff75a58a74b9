"""Linked views (plotly, no Streamlit): what a click on one figure means for another.  Heatmap cells made clickable
(:func:`add_cell_markers`: plotly reports a click on a heatmap as no selection, so each cell gets a transparent marker
whose ``customdata`` is its pair), the pair a click or the address bar's ``pair=i-j`` names (:func:`selected_pair`),
the removal set a click on a removal curve names (:func:`curve_point`, :func:`removal_sentence`) and that set's layers
marked on a depth profile or on heatmaps (:func:`mark_layers`)."""
from __future__ import annotations

import math

from swapkl.views.captions import fmt_number

#: fill and edge of the marks of removed layers
MARK_FILL = "rgba(214, 39, 40, 0.16)"
MARK_LINE = "rgba(214, 39, 40, 0.9)"


def _points(event) -> list[dict]:
    if not isinstance(event, dict):
        return []
    return [p for p in ((event.get("selection") or {}).get("points") or []) if isinstance(p, dict)]


def _heatmap_traces(fig) -> list:
    return [t for t in fig.data if t.type == "heatmap"]


def add_cell_markers(fig, unit: str = "nats"):
    """``fig`` (changed in place, and returned) with one transparent square marker on every finite off-diagonal cell
    of each of its heatmaps, on that heatmap's axes: ``customdata`` [i, j] (row i, column j), hover the heatmap's
    own hover text for the cell when it has one, else "pair (i, j): value ``unit``".  Traces named
    ``"<heatmap name> cells"``."""
    import plotly.graph_objects as go

    for h in _heatmap_traces(fig):
        z = h.z or ()
        ys = list(h.y) if h.y is not None else list(range(len(z)))
        xs = list(h.x) if h.x is not None else list(range(len(z[0]) if len(z) else 0))
        cells = [(r, c) for r, row in enumerate(z) for c, v in enumerate(row)
                 if v is not None and math.isfinite(float(v)) and ys[r] != xs[c]]
        text = h.text if h.text is not None and not isinstance(h.text, str) else None
        if text is not None:
            labels, template = [text[r][c] for r, c in cells], "%{text}"
        else:
            labels = [f"{fmt_number(z[r][c])}" for r, c in cells]
            template = f"pair (%{{customdata[0]}}, %{{customdata[1]}}): %{{text}} {unit}"
        n = max(len(ys), 1)
        fig.add_trace(go.Scatter(x=[xs[c] for _, c in cells], y=[ys[r] for r, _ in cells], mode="markers",
                                 xaxis=h.xaxis or "x", yaxis=h.yaxis or "y", name=f"{h.name} cells",
                                 marker={"size": max(6, min(28, 360 // n)), "opacity": 0.01, "symbol": "square",
                                         "color": "black"},
                                 customdata=[[ys[r], xs[c]] for r, c in cells], text=labels,
                                 hovertemplate=template + f"<extra>{h.name}</extra>", showlegend=False))
    return fig


def selected_pair(event, query_pair: str | None, pairs) -> tuple[int, int] | None:
    """The pair a drill-down shows: the heatmap cell or depth-profile point clicked (a plotly selection ``event``:
    the first point with ``customdata`` [i, j], or a cell's ``y`` = i and ``x`` = j), else the address bar's
    ``pair=i-j``; only a pair of ``pairs`` (as ``(min, max)``), else None."""
    allowed = {tuple(sorted(int(x) for x in p)) for p in pairs}
    cand = []
    for pt in _points(event):
        cd = pt.get("customdata")
        if isinstance(cd, (list, tuple)) and len(cd) == 2:  # a depth-profile point or a cell's marker names its pair
            cand.append(tuple(cd))
        elif all(isinstance(pt.get(k), (int, float)) and float(pt.get(k)).is_integer() for k in ("x", "y")):
            cand.append((pt["y"], pt["x"]))  # a heatmap cell: row i, column j
    if query_pair and "-" in str(query_pair):
        cand.append(tuple(str(query_pair).split("-", 1)))
    for i, j in cand:
        try:
            p = tuple(sorted((int(i), int(j))))
        except (TypeError, ValueError):
            continue
        if p in allowed:
            return p
    return None


def curve_point(fig, curves, event) -> dict | None:
    """The removal set a click on the removal-curves figure ``fig`` names: ``{"method", "n", "removed",
    "delta_pct", "delta_pct_ci"}`` of the clicked point's method (its trace's ``meta``) at n = its x, looked up in
    ``curves`` (a ``CurvesResult`` or its dict); None when no point, or the point is on no method's line, or the
    method has no single removal set there (random: one per seed)."""
    d = curves if isinstance(curves, dict) else curves.to_dict()
    for pt in _points(event):
        k = pt.get("curve_number")
        if not isinstance(k, int) or not 0 <= k < len(fig.data):
            continue
        meta = fig.data[k].meta if isinstance(fig.data[k].meta, dict) else {}
        m = meta.get("method") or meta.get("off_scale")
        x = pt.get("x")
        if m is None or not isinstance(x, (int, float)):
            continue
        e = next((e for e in (d.get("methods") or {}).get(m, []) if int(e["n"]) == round(float(x))), None)
        if e is None or e.get("removed") is None:
            continue
        return {"method": m, "n": int(e["n"]), "removed": [int(v) for v in e["removed"]],
                "delta_pct": e.get("delta_pct"), "delta_pct_ci": e.get("delta_pct_ci")}
    return None


def removal_sentence(sel: dict) -> str:
    """One line naming a removal set of :func:`curve_point`: method, n, the layers and ΔPPL (with its CI)."""
    ci = sel.get("delta_pct_ci")
    ci_s = f" [{fmt_number(ci[0], 2)}, {fmt_number(ci[1], 2)}]" if ci and None not in ci else ""
    return (f"Marked: {sel['method']}-guided removal at n = {sel['n']} removes layers "
            f"{{{', '.join(str(k) for k in sel['removed'])}}}; ΔPPL {fmt_number(sel.get('delta_pct'), 2)} %{ci_s}")


def mark_layers(fig, layers, label: str = "removed"):
    """A copy of ``fig`` with ``layers`` marked: on each heatmap, a shaded band over the row and one over the column
    of every layer (shapes named ``"<label> layer k row"`` / ``"... column"``); on a figure without heatmaps (the
    depth profile, layer k at x = k) a shaded vertical band from k − 0.5 to k + 0.5 (``"<label> layer k"``) labelled
    with k.  ``fig`` itself is left as it is (pages keep it memoised)."""
    import plotly.graph_objects as go

    out = go.Figure(fig)
    heat = _heatmap_traces(out)
    style = {"fillcolor": MARK_FILL, "line": {"color": MARK_LINE, "width": 1}, "layer": "above"}
    for k in sorted({int(v) for v in layers}):
        if not heat:
            out.add_vrect(x0=k - 0.5, x1=k + 0.5, name=f"{label} layer {k}", annotation_text=f"{label} {k}",
                          annotation_position="top", annotation_font_size=10, **style)
            continue
        for h in heat:
            xs = list(h.x) if h.x is not None else list(range(len(h.z[0])))
            ys = list(h.y) if h.y is not None else list(range(len(h.z)))
            xr, yr = h.xaxis or "x", h.yaxis or "y"
            out.add_shape(type="rect", xref=xr, yref=yr, x0=min(xs) - 0.5, x1=max(xs) + 0.5, y0=k - 0.5, y1=k + 0.5,
                          name=f"{label} layer {k} row", **style)
            out.add_shape(type="rect", xref=xr, yref=yr, x0=k - 0.5, x1=k + 0.5, y0=min(ys) - 0.5, y1=max(ys) + 0.5,
                          name=f"{label} layer {k} column", **style)
    return out


def marked_layers(fig) -> dict[str, list[int]]:
    """The layers :func:`mark_layers` marked on ``fig``: ``{"row": [...], "column": [...], "band": [...]}``
    read back from the shapes' geometry (the band's centre), for checks and tests."""
    out: dict[str, list[int]] = {"row": [], "column": [], "band": []}
    for s in fig.layout.shapes or ():
        name = s.name or ""
        if " layer " not in name:
            continue
        kind = "row" if name.endswith(" row") else "column" if name.endswith(" column") else "band"
        a, b = (s.y0, s.y1) if kind == "row" else (s.x0, s.x1)
        out[kind].append(int(round((float(a) + float(b)) / 2)))
    return {k: sorted(v) for k, v in out.items()}
