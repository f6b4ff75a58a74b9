"""Removal curves with a repair after removal (``--repair bridge``, docs/repair.md): each method's bridged curve drawn
over its raw one, the table of raw vs bridged ΔPPL % per n with the paired CI, and the repair's piece of the contract
caption, shared by the dashboard and the HTML report (plotly + pandas; no Streamlit).

Reads a curves dict (:meth:`swapkl.removal.curves.CurvesResult.to_dict`) whose ``repaired[method]`` holds entries
with the keys of ``methods[method]`` plus ``paired_delta_pct`` (bridged − raw ΔPPL %, percentage points of the
baseline perplexity, paired over the same windows) and ``paired_ci`` (its 95 % bootstrap CI; None for a seeded
method's mean over seeds), and whose ``repair`` is ``{"kind": "bridge", "settings", "fits": {"i-j": fit}}``.
Without ``repaired`` every function leaves things as they are (no trace, an empty table, no caption piece).
"""
from __future__ import annotations

from swapkl.removal import methods as M
from swapkl.removal.curves import curves_provenance
from swapkl.views.captions import SEP, contract_caption, fmt_number
from swapkl.views.curves import _curves_dict, method_style
from swapkl.stats import side

#: how a repair is named in legends, tables and captions
REPAIR_LABELS = {"bridge": "linear bridge"}
#: the table's word for a paired CI that includes 0, and for one on either side of it
TIE, BETTER, WORSE = "tie", "bridged better", "bridged worse"


def repaired_methods(curves, methods=None) -> list[str]:
    """The methods (of ``methods``, default all) that have a bridged curve, in the run order."""
    d = _curves_dict(curves)
    rep = d.get("repaired") or {}
    return [m for m in M.run_order(methods if methods is not None else rep) if rep.get(m)]


def repair_caption(curves) -> str:
    """The repair's piece of the contract caption, e.g. ``repair: linear bridge (folded, 8192 calibration tokens,
    window 256, seed 0, ridge 0.0001: ε = ridge·tr(XᵀX)/d, 1.2e-03…4.5e-03 over 3 spans)``; "" without a repair.
    The settings come from the result's ``repair`` (else the plan's ``bridge``; absent fields: "default")."""
    d = _curves_dict(curves)
    rep = d.get("repair") or {}
    plan = d.get("plan") or {}
    kind = rep.get("kind") or (plan.get("repair") if plan.get("repair") not in (None, "none") else None)
    if not kind:
        return ""
    s = dict(rep.get("settings") or plan.get("bridge") or {})
    get = lambda k: "default" if s.get(k) is None else s[k]
    line = (f"repair: {REPAIR_LABELS.get(kind, kind)} ({get('form')}, {get('calib_tokens')} calibration tokens, "
            f"window {get('calib_window')}, seed {get('calib_seed')}, ridge {get('ridge')}")
    eps = [float(f["eps"]) for f in (rep.get("fits") or {}).values() if isinstance(f, dict) and f.get("eps") is not None]
    if eps:
        span = fmt_number(min(eps), 3) if min(eps) == max(eps) else f"{fmt_number(min(eps), 3)}…{fmt_number(max(eps), 3)}"
        line += f": ε = ridge·tr(XᵀX)/d, {span} over {len(eps)} span{'s' if len(eps) != 1 else ''}"
    return line + ")"


def curves_caption(curves) -> str:
    """The contract caption of removal curves (:func:`~swapkl.views.captions.contract_caption` of their provenance)
    with the repair's piece (:func:`repair_caption`) when they were repaired."""
    d = _curves_dict(curves)
    cap = contract_caption(curves_provenance(d))
    rep = repair_caption(d)
    return cap + (SEP + rep if rep else "")


def _raw_colour(fig, m: str, k: int) -> str:
    """The colour of method ``m``'s raw line in ``fig`` (its trace with ``meta.method == m``), else its style's."""
    for t in fig.data:
        if isinstance(t.meta, dict) and t.meta.get("method") == m and t.line is not None and t.line.color:
            return t.line.color
    return method_style(m, k)["color"]


def with_bridged(fig, curves, methods=None):
    """A copy of the removal-curves figure ``fig`` (:func:`swapkl.views.curves.removal_curves` of ``curves``) with
    each method's bridged curve drawn over its raw one: the same colour, dashed, named ``"<label> bridged"``,
    ``meta = {"method": m, "repair": "bridged"}``, y = the bridged ΔPPL % per n.  A fitted y range is widened to
    hold the bridged points.  ``fig`` itself without a bridged curve."""
    import plotly.graph_objects as go

    d = _curves_dict(curves)
    chosen = repaired_methods(d, methods)
    if not chosen:
        return fig
    fig = go.Figure(fig)
    ys = []
    for k, m in enumerate(chosen):
        raw = {int(e["n"]): e for e in (d.get("methods") or {}).get(m) or []}
        entries = [e for e in d["repaired"][m] if e.get("delta_pct") is not None]
        if not entries:
            continue
        hover = []
        for e in entries:
            s = f"n = {e['n']}<br>bridged ΔPPL {fmt_number(e['delta_pct'], 2)} %"
            r = raw.get(int(e["n"]))
            if r is not None and r.get("delta_pct") is not None:
                s += f" (raw {fmt_number(r['delta_pct'], 2)} %)"
            if e.get("paired_delta_pct") is not None:
                s += f"<br>bridged − raw {fmt_number(e['paired_delta_pct'], 2)} pp {_ci_text(e.get('paired_ci'))}"
            hover.append(s)
        y = [float(e["delta_pct"]) for e in entries]
        ys += y
        col = _raw_colour(fig, m, k)
        fig.add_trace(go.Scatter(x=[int(e["n"]) for e in entries], y=y, mode="lines+markers",
                                 name=f"{M.label(m)} bridged", legendgroup=m,
                                 line={"color": col, "width": 2, "dash": "dash"},
                                 marker={"size": 5, "color": col, "symbol": "diamond"}, text=hover,
                                 hovertemplate="%{text}<extra>" + M.label(m) + " bridged</extra>",
                                 meta={"method": m, "repair": "bridged"}))
    rng = fig.layout.yaxis.range
    if rng is not None and ys:
        lo, hi = min(rng[0], min(ys)), max(rng[1], max(ys))
        fig.update_yaxes(range=[lo, hi])
    return fig


def _ci_text(ci) -> str:
    return "" if not ci or None in ci else f"[{fmt_number(ci[0], 2)}, {fmt_number(ci[1], 2)}]"


def verdict(ci) -> str:
    """``tie`` when the paired CI of bridged − raw includes 0, ``bridged better`` when it lies below 0,
    ``bridged worse`` above; "–" without a CI (a seeded method's mean)."""
    if not ci or None in ci:
        return "–"
    return side([float(ci[0]), float(ci[1])], below=BETTER, above=WORSE, neither=TIE)


def repair_table(curves, methods=None):
    """pandas DataFrame, one row per method and n with a bridged point: ``method``, ``n``, ``removed`` ("a, b"),
    ``raw ΔPPL %``, ``bridged ΔPPL %``, ``bridged − raw (pp)`` (the paired difference), ``95 % CI`` ("[lo, hi]"),
    ``verdict`` (:func:`verdict`).  Empty (with these columns) without a repair."""
    import pandas as pd

    d = _curves_dict(curves)
    cols = ["method", "n", "removed", "raw ΔPPL %", "bridged ΔPPL %", "bridged − raw (pp)", "95 % CI", "verdict"]
    rows = []
    for m in repaired_methods(d, methods):
        raw = {int(e["n"]): e for e in (d.get("methods") or {}).get(m) or []}
        for e in d["repaired"][m]:
            r = raw.get(int(e["n"])) or {}
            rem = e.get("removed")
            rows.append({"method": m, "n": int(e["n"]), "removed": "" if rem is None else ", ".join(map(str, rem)),
                         "raw ΔPPL %": r.get("delta_pct"), "bridged ΔPPL %": e.get("delta_pct"),
                         "bridged − raw (pp)": e.get("paired_delta_pct"), "95 % CI": _ci_text(e.get("paired_ci")),
                         "verdict": verdict(e.get("paired_ci"))})
    return pd.DataFrame(rows, columns=cols)


def repair_html(curves, caption: str) -> str:
    """The HTML report's section of repaired curves: the table of :func:`repair_table` with its CSV (the bridged
    curves are in the report's removal-curves figure); "" without a repair."""
    from swapkl.views.captions import csv_link, html_table, html_text

    tbl = repair_table(curves)
    if not len(tbl):
        return ""
    return ("<h3>After repair: raw vs bridged</h3>"
            f"<p>{html_text(repair_caption(curves))}. Bridged − raw in percentage points of the baseline perplexity, "
            "paired over the same windows; tie when the 95 % CI includes 0.</p>"
            + html_table(tbl, caption, nd=2) + csv_link(tbl, caption, "repaired.csv", "download CSV"))


# ============================================================================================ healed after a repair
#: the stages of a heal that starts from a bridged model, and how each is drawn (one colour per method)
STAGES = {"raw": "solid", "bridged": "dash", "healed": "dot"}


def stage_value(v) -> float | None:
    """ΔPPL % vs the base of one stage of a healed point: ``v["delta_pct"]["value"]`` (a row of
    :func:`swapkl.healing.result.compare_bridged`), ``v["delta_pct"]`` or ``v`` when it is a number; None without."""
    if isinstance(v, dict):
        v = v.get("delta_pct")
        v = v.get("value") if isinstance(v, dict) else v
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def stage_of(entry: dict, stage: str) -> float | None:
    """ΔPPL % of ``stage`` at one healed point: its ``stage`` key, else its heal's repair record
    (``entry["repair"]["eval"]["rows"][stage]``); None without."""
    v = entry.get(stage)
    if v is None:
        v = (((entry.get("repair") or {}).get("eval") or {}).get("rows") or {}).get(stage)
    return stage_value(v)


def draws_bridged(fig) -> bool:
    """Whether a healed-curves figure already draws the bridged stage (a trace with ``meta.kind == "bridged"``), so
    the stages figure would repeat it."""
    return any(isinstance(t.meta, dict) and t.meta.get("kind") == "bridged" for t in fig.data)


def healed_stages_figure(heal_curves, caption: str = ""):
    """ΔPPL % (vs the base) against n of each method's raw cut, bridged model and healed model, when the healed
    curves' points carry a ``bridged`` value beside ``raw`` / ``healed`` (a heal started from the bridged model): one
    colour per method, solid / dashed / dotted per stage, traces named ``"<label> <stage>"`` with
    ``meta = {"method", "stage"}``.  None when no point has a bridged value (the healed curves figure already shows
    the raw cut and the healed model)."""
    import plotly.graph_objects as go

    d = heal_curves if isinstance(heal_curves, dict) else heal_curves.to_dict()
    methods = d.get("methods") or {}
    if not any(stage_of(e, "bridged") is not None for v in methods.values() for e in v):
        return None
    fig = go.Figure()
    for k, m in enumerate(M.run_order(methods)):
        col = method_style(m, k)["color"]
        for stage, dash in STAGES.items():
            pts = [(int(e["n"]), stage_of(e, stage)) for e in methods[m]]
            pts = [(n, y) for n, y in pts if y is not None]
            if pts:
                fig.add_trace(go.Scatter(x=[n for n, _ in pts], y=[y for _, y in pts], mode="lines+markers",
                                         name=f"{M.label(m)} {stage}", legendgroup=m,
                                         line={"color": col, "dash": dash, "width": 2}, meta={"method": m,
                                                                                             "stage": stage}))
    fig.add_hline(y=0, line={"color": "black", "width": 0.8})
    fig.update_layout(xaxis_title="layers removed n", yaxis_title="ΔPPL (% of base)", height=420, width=760)
    fig.update_xaxes(dtick=1)
    from swapkl.views.captions import stamp

    return stamp(fig, "Raw cut, bridged and healed", caption)
