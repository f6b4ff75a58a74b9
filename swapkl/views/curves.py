"""Figures and tables of removal curves (ΔPPL and KL to the base model against the number of removed layers, the
removed layers per method), shared by the dashboard and the HTML report (plotly + pandas; no Streamlit).

Units: ΔPPL is in % of the baseline perplexity; ``kl_to_base`` is nats per scored token.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable

from swapkl.removal import methods as M
from swapkl.removal.curves import curves_provenance
from swapkl.views.captions import stamp, contract_caption, fmt_number, rgba

# Deferred imports: plotly and pandas are imported by the functions that draw or tabulate.

BASELINE_COLOURS = ["#7f7f7f", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e"]


def _curves_dict(curves) -> dict:
    if curves is None:
        return {}
    if isinstance(curves, dict):
        return curves
    if isinstance(curves, str):
        s = curves if curves.lstrip().startswith("{") else Path(curves).read_text()
        return json.loads(s)
    if hasattr(curves, "to_dict"):
        return curves.to_dict()
    raise TypeError(f"not a CurvesResult: {type(curves).__name__}")




# ============================================================================================ removal curves
def _method_order(methods: Iterable[str]) -> list[str]:
    return M.run_order(methods)


def _label(m: str) -> str:
    return M.label(m)


def _guided(m: str) -> bool:
    spec = M.find(m)
    return spec is not None and spec.guided


def _seeded(m: str) -> bool:
    spec = M.find(m)
    return spec is not None and spec.seeded


def method_style(m: str, k: int) -> dict:
    """The line style of method ``m`` (its registry style; the k-th baseline colour, dotted, otherwise)."""
    spec = M.find(m)
    if spec is not None and spec.style:
        return {key: v for key, v in spec.style.items() if key != "marker"}
    return {"color": BASELINE_COLOURS[(k + 1) % len(BASELINE_COLOURS)], "width": 1.5, "dash": "dot"}


def _marker_size(m: str) -> int:
    spec = M.find(m)
    return int((spec.style or {}).get("marker", 5)) if spec is not None else 5


def _removed_str(e: dict) -> str:
    rem = e.get("removed")
    return "–" if rem is None else "{" + ", ".join(str(x) for x in rem) + "}"


def _focus_range(all_methods: dict, chosen: list) -> tuple[float, float] | None:
    """y range (ΔPPL %) that keeps the deterministic curves readable: their values with 20 % headroom, 0
    included.  None when there is no deterministic curve, or when the seeded curves fit in it anyway."""
    det, every = [], []
    for m in chosen:
        for e in all_methods[m]:
            v = e.get("delta_pct")
            if v is None or not math.isfinite(float(v)):
                continue
            every += [float(v)] + [float(x) for x in (e.get("delta_pct_max"), e.get("delta_pct_min")) if x is not None]
            if e.get("delta_pct_min") is None and not _seeded(m):
                det.append(float(v))
    if not det:
        return None
    lo, hi = min(0.0, min(det)), max(0.0, max(det))
    span = max(hi - lo, 1.0)
    rng = (lo - 0.08 * span, hi + 0.2 * span)
    if all(rng[0] <= v <= rng[1] for v in every):
        return None
    return rng


def removal_curves(curves, methods: Iterable[str] | None = None, bands: bool = True, caption: str | None = None,
                   full_range: bool = False):
    """ΔPPL % (vs the unpruned baseline) against n layers removed, one line per method.

    ``curves``: a ``CurvesResult`` or its dict (``methods[name]`` = entries ``{n, removed, ppl, delta_pct,
    delta_pct_ci, ...}``).  Replacement- and interchange-guided are drawn thick; baselines thin.  ``bands``:
    95 % bootstrap CI band (``delta_pct_ci``) per method; for ``random`` the line is the mean over seeds and the
    band spans min–max over seeds.  Band traces are named ``"<method> band"``.

    The y axis is fitted to the deterministic curves (``layout.meta["focus_range"]``), so a seeded baseline's
    spread (random: often several times the guided ΔPPL) does not flatten them; points above the range are
    drawn as triangles at its top edge, labelled with their value (traces ``"<method> off scale"``).
    ``full_range=True`` shows every value instead."""
    import plotly.graph_objects as go

    d = _curves_dict(curves)
    all_methods = d.get("methods") or {}
    chosen = _method_order(m for m in (methods if methods is not None else all_methods) if m in all_methods)
    fig = go.Figure()
    for k, m in enumerate(chosen):
        entries = [e for e in all_methods[m] if e.get("delta_pct") is not None]
        if not entries:
            continue
        st = method_style(m, k)
        ns = [int(e["n"]) for e in entries]
        if bands:
            if _seeded(m) or entries[0].get("delta_pct_min") is not None:
                lo = [e.get("delta_pct_min") for e in entries]
                hi = [e.get("delta_pct_max") for e in entries]
                band_kind = "min–max over seeds"
            else:
                lo = [(e.get("delta_pct_ci") or [None, None])[0] for e in entries]
                hi = [(e.get("delta_pct_ci") or [None, None])[1] for e in entries]
                band_kind = "95 % CI"
            if all(v is not None for v in lo + hi):
                fig.add_trace(go.Scatter(x=ns + ns[::-1], y=hi + lo[::-1], fill="toself", mode="lines",
                                         line={"width": 0}, fillcolor=rgba(st["color"], 0.15 if _guided(m) else 0.08),
                                         name=f"{m} band", legendgroup=m, showlegend=False, hoverinfo="skip",
                                         meta={"band": band_kind}))
        hover = []
        for e in entries:
            s = f"n = {e['n']}<br>removed {_removed_str(e)}<br>ΔPPL {fmt_number(e['delta_pct'], 2)} %"
            ci = e.get("delta_pct_ci")
            if ci and None not in ci:
                s += f" [{fmt_number(ci[0], 2)}, {fmt_number(ci[1], 2)}]"
            if e.get("delta_pct_min") is not None:
                s += f" (seeds: {fmt_number(e['delta_pct_min'], 2)} … {fmt_number(e['delta_pct_max'], 2)})"
            if e.get("ppl") is not None:
                s += f"<br>PPL {fmt_number(e['ppl'], 3)}"
            hover.append(s)
        fig.add_trace(go.Scatter(x=ns, y=[float(e["delta_pct"]) for e in entries], mode="lines+markers",
                                 name=_label(m) + (" (mean of seeds)" if _seeded(m) else ""), legendgroup=m,
                                 line=st, marker={"size": _marker_size(m), "color": st["color"]},
                                 text=hover, hovertemplate="%{text}<extra>" + _label(m) + "</extra>",
                                 meta={"method": m}))
    base = d.get("baseline_ppl")
    title = "ΔPPL after layer removal" + (f" (baseline PPL {fmt_number(base, 3)})" if base is not None else "")
    fig.add_hline(y=0, line={"color": "black", "width": 0.8})
    rng = None if full_range else _focus_range(all_methods, chosen)
    if rng is not None:
        fig.update_yaxes(range=list(rng))
        for k, m in enumerate(chosen):
            off = [e for e in all_methods[m] if e.get("delta_pct") is not None and float(e["delta_pct"]) > rng[1]]
            if not off:
                continue
            col = method_style(m, k)["color"]
            top = rng[1] - 0.03 * (rng[1] - rng[0])
            fig.add_trace(go.Scatter(x=[int(e["n"]) for e in off], y=[top] * len(off), mode="markers+text",
                                     marker={"symbol": "triangle-up", "size": 11, "color": col},
                                     text=[f"{fmt_number(e['delta_pct'], 1)} %" for e in off], textposition="bottom center",
                                     textfont={"size": 10, "color": col}, name=f"{m} off scale", legendgroup=m,
                                     showlegend=False, hovertemplate="%{text} (above the range shown)<extra>"
                                     + _label(m) + "</extra>", meta={"off_scale": m}))
    fig.update_layout(meta={"focus_range": list(rng) if rng else None})
    fig.update_layout(xaxis_title="layers removed n", yaxis_title="ΔPPL (% of baseline)", height=460, width=760,
                      legend={"orientation": "v"}, hovermode="closest")
    fig.update_xaxes(dtick=1)
    return stamp(fig, title, caption or contract_caption(curves_provenance(d)))


def kl_to_base_figure(curves, methods: Iterable[str] | None = None, caption: str | None = None):
    """Mean KL(base ‖ pruned) per scored token (nats) against n layers removed, one line per method
    (random: mean over seeds)."""
    import plotly.graph_objects as go

    d = _curves_dict(curves)
    all_methods = d.get("methods") or {}
    chosen = _method_order(m for m in (methods if methods is not None else all_methods) if m in all_methods)
    fig = go.Figure()
    for k, m in enumerate(chosen):
        entries = [e for e in all_methods[m] if e.get("kl_to_base") is not None]
        if not entries:
            continue
        st = method_style(m, k)
        fig.add_trace(go.Scatter(x=[int(e["n"]) for e in entries], y=[float(e["kl_to_base"]) for e in entries],
                                 mode="lines+markers", name=_label(m), line=st, meta={"method": m},
                                 text=[_removed_str(e) for e in entries],
                                 hovertemplate="n = %{x}<br>removed %{text}<br>KL %{y:.4g} nats<extra>"
                                               + _label(m) + "</extra>"))
    fig.update_layout(xaxis_title="layers removed n", yaxis_title="KL(base ‖ pruned), nats per token", height=420,
                      width=760)
    fig.update_xaxes(dtick=1)
    return stamp(fig, "Distance of the pruned model from the base model", caption or contract_caption(curves_provenance(d)))


def removed_layers_table(curves):
    """pandas DataFrame, one row per budget n: column ``n``, one column per method whose sets are
    deterministic (the removed layers as "a, b, c"; random is left out: its sets differ per seed), and
    ``repl_vs_inter_differ`` (bool) when both guided methods are present."""
    import pandas as pd

    d = _curves_dict(curves)
    all_methods = d.get("methods") or {}
    chosen = [m for m in _method_order(all_methods)
              if all_methods[m] and all(e.get("removed") is not None for e in all_methods[m])]
    n_max = max((len(all_methods[m]) for m in chosen), default=0)
    rows = []
    for n in range(1, n_max + 1):
        row = {"n": n}
        sets = {}
        for m in chosen:
            e = next((e for e in all_methods[m] if int(e["n"]) == n), None)
            sets[m] = None if e is None else tuple(e["removed"])
            row[m] = "" if e is None else ", ".join(str(x) for x in e["removed"])
        if "replacement" in chosen and "interchange" in chosen:
            row["repl_vs_inter_differ"] = sets["replacement"] != sets["interchange"]
        rows.append(row)
    cols = ["n"] + chosen + (["repl_vs_inter_differ"] if "replacement" in chosen and "interchange" in chosen else [])
    return pd.DataFrame(rows, columns=cols)
