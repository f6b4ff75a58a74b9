"""Blocks, attention and MLP removal on one x axis: the share of non-embedding parameters a set removes (and,
second, the measured prefill speed-up of swapkl's skipping runtime), against the held-out ΔPPL.  It answers: at the
same size reduction, which is cheaper to remove, whole blocks or sublayers?

Input: removal-curves results (:class:`~swapkl.removal.curves.CurvesResult` or their dicts) of one model, one per
unit (block, attention, mlp), each carrying ``sizes`` (and ``gains`` for the speed-up axis).  Plotly and pandas,
imported by the functions that draw; no Streamlit."""
from __future__ import annotations

from swapkl.contract import UNITS
from swapkl.removal import methods as M
from swapkl.removal.curves import curves_provenance
from swapkl.views.captions import stamp, contract_caption
from swapkl.views.curves import _curves_dict

UNIT_DASH = dict(zip(UNITS, ("solid", "dash", "dot")))  # block, attention, mlp
UNIT_SYMBOL = dict(zip(UNITS, ("circle", "triangle-up", "square")))
AXES = {"params": "non-embedding parameters removed (%)", "speedup": "measured prefill speed-up (×, skipping runtime)"}


def _removed_share(d: dict, entry: dict) -> float | None:
    """% of non-embedding parameters ``entry`` removes (the mean over seeds for a seeded method)."""
    from swapkl.surgery.sizes import params_removed

    sizes = d.get("sizes") or {}
    if not sizes.get("non_embedding"):
        return None
    unit = d.get("unit", "block")
    sets = ([entry["removed"]] if entry.get("removed") is not None else
            [p["removed"] for p in entry.get("per_seed") or [] if p.get("removed") is not None])
    if not sets:
        return None
    return 100.0 * sum(params_removed(sizes, s, unit) for s in sets) / len(sets) / sizes["non_embedding"]


#: how a bridged curve (``CurvesResult.repaired``) is named on the common axis: ``"replacement+bridge"``
BRIDGED_SUFFIX = "+bridge"


def _bridge_params_pct(d: dict, entry: dict) -> float:
    """% of non-embedding parameters the bridges of ``entry``'s set add back: a residual bridge is a D×D map of its
    own (``params_added`` in the run's fit summaries), a folded one changes an existing projection (0)."""
    fits = (d.get("repair") or {}).get("fits") or {}
    total = (d.get("sizes") or {}).get("non_embedding")
    if not total or entry.get("removed") is None:
        return 0.0
    added, start = 0, None
    layers = sorted(entry["removed"])
    for k, x in enumerate(layers):  # each maximal run [start, x + 1) of consecutive layers is one bridge
        start = x if start is None or layers[k - 1] != x - 1 else start
        if k + 1 == len(layers) or layers[k + 1] != x + 1:
            added += int((fits.get(f"{start}-{x + 1}") or {}).get("params_added") or 0)
    return 100.0 * added / total


def _bridged_rows(d: dict, methods) -> list[dict]:
    """The common-axis rows of every bridged curve of ``d`` (method ``name+bridge``; no gains measured)."""
    rows = []
    for name, entries in (d.get("repaired") or {}).items():
        if methods is not None and name not in methods:
            continue
        for e in entries:
            share = _removed_share(d, e)
            rows.append({"unit": d.get("unit", "block"), "method": name + BRIDGED_SUFFIX, "n": e["n"],
                         "removed": e.get("removed"),
                         "params_removed_pct": None if share is None else share - _bridge_params_pct(d, e),
                         "delta_pct": e.get("delta_pct"), "delta_pct_ci": e.get("delta_pct_ci"),
                         "kl_to_base": e.get("kl_to_base"), "prefill_speedup": None, "decode_speedup": None,
                         "memory_ratio": None})
    return rows


def common_axis_rows(curves_list, methods=None) -> list[dict]:
    """One row per (unit, method, n): ``unit``, ``method``, ``n``, ``removed``, ``params_removed_pct``,
    ``delta_pct`` and its CI, ``kl_to_base``, and when measured ``prefill_speedup``, ``decode_speedup``,
    ``memory_ratio``.  A run with ``--repair bridge`` adds its bridged curves as methods ``name+bridge`` (their
    parameters removed net of what residual bridges add)."""
    from swapkl.measure.gains import point_gains

    rows = []
    for c in curves_list:
        d = _curves_dict(c)
        unit = d.get("unit", "block")
        for name, entries in (d.get("methods") or {}).items():
            if methods is not None and name not in methods:
                continue
            for e in entries:
                g = point_gains(d, name, e["n"]) or {}
                rows.append({"unit": unit, "method": name, "n": e["n"], "removed": e.get("removed"),
                             "params_removed_pct": _removed_share(d, e), "delta_pct": e.get("delta_pct"),
                             "delta_pct_ci": e.get("delta_pct_ci"), "kl_to_base": e.get("kl_to_base"),
                             "prefill_speedup": g.get("prefill_speedup"), "decode_speedup": g.get("decode_speedup"),
                             "memory_ratio": g.get("memory_ratio")})
        rows.extend(_bridged_rows(d, methods))
    return rows


def common_axis_figure(curves_list, methods=None, axis: str = "params"):
    """ΔPPL % against the share of non-embedding parameters removed (``axis="params"``) or the measured prefill
    speed-up (``axis="speedup"``; points without gains are left out), one line per (unit, method): colour by
    method, dash and marker by unit."""
    import plotly.graph_objects as go

    if axis not in AXES:
        raise ValueError(f"axis is one of {', '.join(AXES)}")
    rows = common_axis_rows(curves_list, methods)
    key = "params_removed_pct" if axis == "params" else "prefill_speedup"
    fig = go.Figure()
    groups: dict = {}
    for r in rows:
        if r[key] is not None and r["delta_pct"] is not None:
            groups.setdefault((r["unit"], r["method"]), []).append(r)
    palette = ["#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#9467bd", "#8c564b", "#ff7f0e", "#17becf"]
    names = sorted({m for _, m in groups}, key=lambda m: (M.find(m).order if M.find(m) else 100, m))
    for (unit, method), pts in sorted(groups.items(), key=lambda kv: (list(UNIT_DASH).index(kv[0][0]), kv[0][1])):
        spec = M.find(method)
        colour = (spec.style or {}).get("color") if spec is not None and spec.style else None
        colour = colour or palette[names.index(method) % len(palette)]
        pts = sorted(pts, key=lambda r: r["n"])
        fig.add_trace(go.Scatter(
            x=[0.0 if axis == "params" else 1.0] + [r[key] for r in pts], y=[0.0] + [r["delta_pct"] for r in pts],
            mode="lines+markers", name=f"{unit}: {M.label(method)}",
            line={"color": colour, "dash": UNIT_DASH.get(unit, "solid")},
            marker={"symbol": UNIT_SYMBOL.get(unit, "circle"), "size": 8},
            customdata=[[unit, 0, ""]] + [[unit, r["n"], str(r["removed"])] for r in pts],
            hovertemplate="%{customdata[0]} n=%{customdata[1]} %{customdata[2]}<br>x=%{x:.3g}<br>"
                          "ΔPPL=%{y:.2f}%<extra></extra>"))
    fig.update_layout(xaxis_title=AXES[axis], yaxis_title="ΔPPL (%)", legend_title="unit: method",
                      height=520, template="plotly_white")
    first = _curves_dict(curves_list[0]) if curves_list else {}
    title = ("Blocks vs sublayers: ΔPPL against parameters removed" if axis == "params" else
             "Blocks vs sublayers: ΔPPL against measured speed-up")
    units = ", ".join(sorted({_curves_dict(c).get("unit", "block") for c in curves_list}))
    return stamp(fig, title, (contract_caption(curves_provenance(first)) if first else "") + f" · units: {units}")


def units_axis_caption(curves) -> str:
    """What the dashboard says under the common-axis figure of one curves result."""
    d = _curves_dict(curves)
    unit = d.get("unit", "block")
    return (f"The same curves against the share of non-embedding parameters removed ({unit} sets). Put blocks, "
            "attention and MLP on this axis together with 'swapkl curves --unit U --with OTHER.json --figure F.html'.")


def units_export_hint(curves) -> str:
    """How to export a sublayer set (the dashboard's export writes blocks)."""
    unit = _curves_dict(curves).get("unit", "block")
    return (f"Export a {unit} set from the command line: 'swapkl prune MODEL --unit {unit} --remove LAYERS --out DIR "
            "--verify' writes a Hugging Face folder with the removed sublayers' output projections zeroed. Stock "
            "runtimes still compute a zeroed sublayer, so the speed and KV-cache gain needs a skipping runtime.")


def cost_gain_frame(curves):
    """One row per measured point of a curves result with gains: method, n, removed, ΔPPL % (the cost) beside the
    share of non-embedding parameters removed, the prefill and decode speed-ups and the memory ratio (the gain);
    an empty frame when nothing was measured."""
    import pandas as pd

    rows = [r for r in common_axis_rows([curves]) if r["prefill_speedup"] is not None]
    cols = ["method", "n", "removed", "ΔPPL %", "non-emb params removed %", "prefill ×", "decode ×", "memory ×"]
    return pd.DataFrame([[r["method"], r["n"], str(r["removed"]), r["delta_pct"], r["params_removed_pct"],
                          r["prefill_speedup"], r["decode_speedup"], r["memory_ratio"]] for r in rows], columns=cols)


def cost_gain_html(curves, caption: str) -> str:
    """The report's cost-vs-gain section (nothing when the curves carry no measured gains)."""
    from swapkl.views.captions import html_table, html_text

    d = _curves_dict(curves)
    df = cost_gain_frame(d)
    if not len(df):
        return ""
    st = (d.get("gains") or {}).get("settings") or {}
    return ("<h3>Cost vs gain (measured)</h3>"
            f"<p>Gains measured base vs pruned in one run on {html_text(st.get('device'))} "
            f"({html_text(st.get('dtype'))}), context {html_text(st.get('context'))} tokens + "
            f"{html_text(st.get('decode_tokens'))} decoded; {html_text(st.get('runtime'))}. Memory: parameters plus "
            "the KV cache at that context.</p>" + html_table(df, caption, nd=3))
