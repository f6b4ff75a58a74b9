"""Figures, tables and the report section of healed curves (:class:`swapkl.healing.curves.HealCurves`): ΔPPL vs n
before healing (solid) and after (dashed), against the base and against the fine-tuned base, with the recipe in
the contract caption, the paired comparison of two methods per n and its headline (plotly + pandas; no
Streamlit)."""
from __future__ import annotations

from swapkl.healing.curves import HealCurves, method_label
from swapkl.views.captions import SEP, stamp, contract_caption, csv_link, html_table, html_text
from swapkl.views.curves import method_style

# Deferred imports: plotly and pandas are imported by the functions that draw or tabulate.

PANELS = (("healed_vs_base", "ΔPPL % vs the base"), ("healed_vs_base_finetuned", "ΔPPL % vs the fine-tuned base"))


def as_curves(hc) -> HealCurves:
    if isinstance(hc, HealCurves):
        return hc
    if isinstance(hc, dict):
        return HealCurves.from_dict(hc)
    raise TypeError(f"not healed curves: {type(hc).__name__}")


def caption(hc) -> str:
    """The contract caption of healed curves: model, evaluator, corpus, the recipe and the training text."""
    return contract_caption(as_curves(hc).provenance())


def _err(entries, key):
    """Error bars of ``e["delta_pct"][key]`` per entry (``key`` None: ``e["delta_pct"]`` itself)."""
    vals = [e["delta_pct"][key] if key is not None else e["delta_pct"] for e in entries]
    return {"type": "data", "symmetric": False, "array": [v["ci"][1] - v["value"] for v in vals],
            "arrayminus": [v["value"] - v["ci"][0] for v in vals], "thickness": 1}


def healed_traces(hc, key: str = "healed_vs_base", methods=None, before: bool = False) -> list:
    """One dashed trace per method: its healed ΔPPL % (``key`` of ``delta_pct``) vs n with the paired CI as error
    bars (``meta``: method and kind ``healed``); with ``before``, also the solid pre-healing curve and, after a
    ``--repair bridge`` heal, the dotted bridged one (kind ``bridged``: the bridged model before training)."""
    import plotly.graph_objects as go

    hc = as_curves(hc)
    out = []
    for k, m in enumerate(methods or hc.methods):
        entries = hc.methods.get(m) or []
        if not entries:
            continue
        color = method_style(m, k).get("color", "#444")
        x = [e["n"] for e in entries]
        if before:
            out.append(go.Scatter(x=x, y=[e["delta_pct"]["pruned_vs_base"]["value"] for e in entries],
                                  error_y=_err(entries, "pruned_vs_base"), mode="lines+markers",
                                  name=f"{method_label(m)} (before healing)", line={"color": color, "width": 2},
                                  legendgroup=m, meta={"method": m, "kind": "before"}))
            bridged = [e for e in entries if e.get("bridged")]
            if bridged:  # a --repair bridge heal: the bridged start, before healing (dotted)
                out.append(go.Scatter(x=[e["n"] for e in bridged],
                                      y=[e["bridged"]["delta_pct"]["value"] for e in bridged],
                                      error_y=_err([e["bridged"] for e in bridged], None), mode="lines+markers",
                                      name=f"{method_label(m)} bridged (before healing)",
                                      line={"color": color, "width": 2, "dash": "dot"}, marker={"symbol": "square"},
                                      legendgroup=m, meta={"method": m, "kind": "bridged"}))
        out.append(go.Scatter(x=x, y=[e["delta_pct"][key]["value"] for e in entries], error_y=_err(entries, key),
                              mode="lines+markers", name=f"{method_label(m)} healed",
                              line={"color": color, "width": 2, "dash": "dash"}, marker={"symbol": "diamond"},
                              legendgroup=m, meta={"method": m, "kind": "healed", "delta": key},
                              customdata=[[str(e["removed"])] for e in entries],
                              hovertemplate="n=%{x} removed %{customdata[0]}<br>healed ΔPPL %{y:.1f} %<extra></extra>"))
    return out


def with_healed(fig, hc, methods=None):
    """A copy of a removal-curves figure (ΔPPL % vs n against the base) with the dashed healed curves added and
    the recipe appended to its contract caption."""
    import plotly.graph_objects as go

    new = go.Figure(fig)
    traces = healed_traces(hc, "healed_vs_base", methods)
    for tr in traces:
        new.add_trace(tr)
    rng = new.layout.yaxis.range  # a focused y range (views.curves): widen it to hold the healed points and CIs
    if rng is not None and traces:
        vals = [y + s * d for tr in traces for y, dp, dm in zip(tr.y, tr.error_y.array, tr.error_y.arrayminus)
                for s, d in ((1, dp), (-1, dm))]
        span = max(rng[1] - rng[0], 1.0)
        new.update_yaxes(range=[min(rng[0], min(vals) - 0.08 * span), max(rng[1], max(vals) + 0.08 * span)])
    meta = new.layout.meta if isinstance(new.layout.meta, dict) else {}
    recipe = as_curves(hc).recipe_line()
    new.update_layout(meta=dict(meta, contract=f"{meta.get('contract', '')}{SEP}healed: {recipe}", healed=recipe))
    return new


def heal_figure(hc, methods=None):
    """Two panels, ΔPPL % vs n: against the base (before healing solid, healed dashed) and healed against the
    fine-tuned base (dashed); CIs as error bars; the contract caption with the recipe."""
    from plotly.subplots import make_subplots

    hc = as_curves(hc)
    fig = make_subplots(rows=1, cols=2, subplot_titles=[t for _, t in PANELS], horizontal_spacing=0.1)
    for tr in healed_traces(hc, "healed_vs_base", methods, before=True):
        fig.add_trace(tr, row=1, col=1)
    for tr in healed_traces(hc, "healed_vs_base_finetuned", methods):
        tr.showlegend = False
        fig.add_trace(tr, row=1, col=2)
    for col in (1, 2):
        fig.add_hline(y=0, line={"color": "black", "width": 0.8}, row=1, col=col)
        fig.update_xaxes(title_text="layers removed (n)", dtick=1, row=1, col=col)
    fig.update_yaxes(title_text="ΔPPL %", row=1, col=1)
    _fit_healed(fig, hc)
    fig.update_layout(template="plotly_white", height=460, legend={"orientation": "h", "y": -0.2},
                      meta={"healed": hc.recipe_line(), "headline": hc.headline})
    return stamp(fig, "Healed curves: ΔPPL before and after healing", caption(hc))


def _fit_healed(fig, hc, factor: float = 4.0) -> None:
    """When the damage before healing dwarfs the healed curves (a before-healing point above ``factor`` × the
    largest healed |ΔPPL|, at least 25 %), fit the left panel's y axis to the healed curves and name the points
    above it in a note (the table has every number)."""
    healed = [abs(v) for e in (e for v in hc.methods.values() for e in v)
              for v in (e["delta_pct"]["healed_vs_base"]["ci"] + [e["delta_pct"]["healed_vs_base"]["value"]])]
    if not healed:
        return
    cap = factor * max(max(healed), 25.0)
    above = [(m, e["n"], e["delta_pct"]["pruned_vs_base"]["value"]) for m, v in hc.methods.items() for e in v
             if e["delta_pct"]["pruned_vs_base"]["value"] > cap]
    if not above:
        return
    low = min(-max(healed), 0.0) * 1.15 - 5.0
    fig.update_yaxes(range=[low, cap], row=1, col=1)
    fig.add_annotation(text="above the axis, before healing: " + ", ".join(
        f"{method_label(m)} n={n} {v:+.0f} %" for m, n, v in above), xref="x domain", yref="y domain", x=0.0,
        y=1.0, xanchor="left", yanchor="top", showarrow=False, font={"size": 10})


def _ci(x: dict | None, scale: float = 1.0, unit: str = "") -> str:
    if not x or x.get("value") is None:
        return "–"
    lo, hi = x["ci"]
    return f"{scale * x['value']:+.1f}{unit} [{scale * lo:+.1f}, {scale * hi:+.1f}]"


def heal_table(hc):
    """One row per method and n: removed set, ΔPPL % before healing and healed (vs base, vs fine-tuned base) with
    their CIs, the share recovered with its CI, steps and tokens."""
    import pandas as pd

    hc = as_curves(hc)
    rows = []
    for m, entries in hc.methods.items():
        for e in entries:
            d = e["delta_pct"]
            rec = None if e.get("recovered") is None else {"value": e["recovered"], "ci": e.get("recovered_ci")
                                                           or [e["recovered"], e["recovered"]]}
            rows.append({"method": method_label(m), "n": e["n"], "removed": str(e["removed"]),
                         "ΔPPL % before healing": _ci(d["pruned_vs_base"]),
                         "healed ΔPPL % vs base": _ci(d["healed_vs_base"]),
                         "healed ΔPPL % vs fine-tuned base": _ci(d["healed_vs_base_finetuned"]),
                         "recovered %": _ci(rec, 100.0), "PPL pruned": e["ppl"]["pruned"],
                         "PPL healed": e["ppl"]["healed"], "steps": hc.recipe.get("steps"),
                         "tokens": hc.recipe.get("tokens_seen")})
    return pd.DataFrame(rows)


def comparison_table(hc):
    """One row per n: the two methods' sets and the paired differences A − B (percentage points) with their CIs
    and words."""
    import pandas as pd

    hc = as_curves(hc)
    rows = []
    for c in hc.comparisons:
        d = c["diff"]
        rows.append({"n": c["n"], "A": method_label(c["a"]), "B": method_label(c["b"]),
                     "A removes": str(c["removed_a"]), "B removes": str(c["removed_b"]),
                     "A − B before healing (pp)": _ci(d["before"]), "before": d["before"]["word"],
                     "A − B healed, vs base (pp)": _ci(d["healed"]), "healed": d["healed"]["word"],
                     "A − B healed, vs fine-tuned base (pp)": _ci(d["healed_vs_finetuned"]),
                     "healed (vs fine-tuned)": d["healed_vs_finetuned"]["word"], "same set": c["same_set"]})
    return pd.DataFrame(rows)


def section(hc):
    """The healing section of the HTML report (:class:`swapkl.views.report.Section`): the healed-curves figure,
    the table with CIs, the paired comparison, the headline, the recipe and the contract caption."""
    from swapkl.views.report import Section

    hc = as_curves(hc)
    cap = caption(hc)
    base, ft = hc.base_ppl, hc.finetuned_ppl
    intro = (f"<p>Each method's set at each n healed with one recipe (<b>{html_text(hc.recipe_line())}</b>, "
             f"{html_text(hc.recipe.get('tokens_seen'))} training tokens) and measured on the same evaluation "
             "windows as the base and the control: the unpruned base fine-tuned with the same recipe on the same "
             f"text (PPL {base:.4g} → {ft:.4g}), so that domain adaptation is not counted as healing. CIs: paired "
             "bootstrap over the shared windows; a CI that includes 0 is a tie.</p>")
    if hc.headline:
        intro += f"<p><b>{html_text(hc.headline[0].upper() + hc.headline[1:])}.</b></p>"
    table, comp = heal_table(hc), comparison_table(hc)
    blocks = [html_table(table, cap), csv_link(table, cap, "healed_curves.csv", "download CSV")]
    if len(comp):
        blocks += ["<h3>Paired comparison per n</h3>", html_table(comp, cap),
                   "".join(f"<p>{html_text(c['sentence'])}</p>" for c in hc.comparisons)]
    blocks += [f"<p>{html_text('note: ' + n)}</p>" for n in hc.notes]
    figures = [heal_figure(hc)]
    if hc.tasks:  # task accuracy after healing (swapkl heal --tasks)
        from swapkl.healing.task_figures import blocks_and_figures

        more, figs = blocks_and_figures(hc.tasks)
        blocks, figures = blocks + more, figures + figs
    return Section(title="Healing after removal", intro=intro, figures=tuple(figures), blocks=tuple(blocks))
