"""Figures and tables of one score result (heatmaps, the protocol gap, one pair's distribution, the depth profile,
the top pairs), shared by the dashboard and the HTML report (plotly + pandas; no Streamlit).

Units: swap-KL values are nats (``KL(base || variant)``, mean over positions then prompts).  Matrices are L x L with
NaN where a pair was not computed; plotted cells for NaN are blank (``null`` in the figure JSON), never zero.
"""
from __future__ import annotations

import math

import numpy as np

from swapkl.errors import SwapklError
from swapkl.scoring.results import CONDITIONAL, matrix_json, STRONG
from swapkl.stats import bootstrap_indices, percentile_ci
from swapkl.views.captions import stamp, contract_caption, fmt_ci, fmt_number, rgba

# Deferred imports: plotly and pandas are imported by the functions that draw or tabulate: the CLI and the
# dashboard's first paint import this module without them.

LOG_FLOOR = 1e-6  # nats: values <= 0 are drawn at this floor on the log scale (hover shows the true value)
# the two protocols' colours in the score figures (the guided methods' curves use the same, from their registry style)
PROTOCOL_COLOURS = {"replacement": "#1f77b4", "interchange": "#d62728"}


def _pair_lookup(result) -> dict:
    """{(i, j) with i < j: pair_table row as dict} (bootstrap CIs when the result has > 1 prompt)."""
    df = result.pair_table(ci=True)
    return {(int(r["i"]), int(r["j"])): r for r in df.to_dict("records")}


def _directed_ci(result) -> dict:
    """{(i, j): (lo, hi)} 95 % bootstrap CI (prompts resampled) of each directed mean R[i][j], nats."""
    if result.num_prompts < 2:
        return {}
    idx = bootstrap_indices(result.num_prompts)
    out = {}
    for key, v in result.per_prompt["repl"].items():
        b = np.asarray(v)[idx].mean(-1)
        out[tuple(key)] = tuple(percentile_ci(b))
    return out


def _hover_texts(result, lookup: dict, directed: bool, dci: dict) -> tuple[list, list]:
    """Hover strings for the left (replacement) and right (interchange) panels, L x L each."""
    L = result.num_layers
    R = result.replacement_directed()
    left = [["" for _ in range(L)] for _ in range(L)]
    right = [["" for _ in range(L)] for _ in range(L)]
    for i in range(L):
        for j in range(L):
            a, b = min(i, j), max(i, j)
            row = lookup.get((a, b))
            if row is None:
                why = result.undefined.get((a, b)) if a != b else None
                if why is not None:
                    left[i][j] = right[i][j] = f"i = {a}, j = {b}<br>n/a: {_wrap(why)}"
                continue
            common = (f"d_repl = {fmt_number(row['d_repl'])}{fmt_ci(row.get('d_repl_lo'), row.get('d_repl_hi'))} nats<br>"
                      f"d_inter = {fmt_number(row['d_inter'])}{fmt_ci(row.get('d_inter_lo'), row.get('d_inter_hi'))} nats<br>"
                      f"gap = {fmt_number(row['gap'])}{fmt_ci(row.get('gap_lo'), row.get('gap_hi'))} nats")
            if directed:
                lo_hi = dci.get((i, j), (None, None))
                head = (f"slot i = {i}, block j = {j}<br>R[{i}][{j}] = {fmt_number(R[i, j])}{fmt_ci(*lo_hi)} nats "
                        f"(slot {i} runs block {j})<br>R[{j}][{i}] = {fmt_number(R[j, i])} nats<br>")
            else:
                head = f"i = {a}, j = {b}<br>R[{a}][{b}] = {fmt_number(R[a, b])}, R[{b}][{a}] = {fmt_number(R[b, a])} nats<br>"
            left[i][j] = head + common
            right[i][j] = f"i = {a}, j = {b}<br>" + common
    return left, right


def _wrap(text: str, width: int = 60) -> str:
    """``text`` broken into hover lines of about ``width`` characters."""
    import textwrap

    return "<br>".join(textwrap.wrap(text, width)) or text


def _log_ticks(zmin: float, zmax: float) -> tuple[list, list]:
    """Colour-bar ticks for log10 values in [zmin, zmax]: 1-2-5 steps per decade (or decades only when the
    range spans more than three decades), labelled with the value in nats."""
    lo, hi = math.floor(zmin), math.ceil(zmax)
    mults = (1,) if hi - lo > 3 else (1, 2, 5)
    vals = [math.log10(m) + e for e in range(lo, hi + 1) for m in mults]
    eps = 1e-9
    vals = [v for v in vals if zmin - eps <= v <= zmax + eps]
    if len(vals) < 2:  # a narrow range: label the ends
        vals = sorted(set(vals) | {zmin, zmax})
    return vals, [f"{10.0 ** v:.3g}" for v in vals]


def layer_ticks(L: int) -> list[int]:
    """The tick values of a layer axis: every layer index 0..L-1 up to 32 layers, else every k-th (about 16 ticks),
    always within 0..L-1."""
    step = 1 if L <= 32 else math.ceil(L / 16)
    return list(range(0, L, step))


def layer_axes(fig, L: int, x_title: str = "layer j", y_title: str = "layer i", **where):
    """Fix a heatmap's axes to the real layer indices: x over [-0.5, L-0.5], y the same reversed (row 0 on top),
    ticks :func:`layer_ticks` -- so nothing drawn on top (the clickable cell markers, marked bands) widens them
    past the first and last layer.  ``where``: ``row``/``col`` of a subplot."""
    ticks = layer_ticks(L)
    fig.update_xaxes(title_text=x_title, range=[-0.5, L - 0.5], autorange=False, tickmode="array", tickvals=ticks,
                     showgrid=False, zeroline=False, **where)
    fig.update_yaxes(title_text=y_title, range=[L - 0.5, -0.5], autorange=False, tickmode="array", tickvals=ticks,
                     showgrid=False, zeroline=False, **where)
    return fig


# ============================================================================================ heatmaps
def heatmaps(result, scale: str = "linear", directed: bool = False, colorscale: str = "Viridis",
             caption: str | None = None):
    """Replacement and interchange swap-KL side by side on ONE shared colour scale.

    Left: ``d_repl`` [L, L] (symmetric; or with ``directed=True`` the directed means ``R[i][j]``, rows = slot i,
    columns = block j); right: ``d_inter`` [L, L].  Both traces use the layout's ``coloraxis`` (same
    ``cmin``/``cmax``).  ``scale="log"``: the cells hold log10 of the values (nats; values <= 0 drawn at
    ``LOG_FLOOR``) and the colour bar ticks are labelled in nats.  NaN = not computed = blank.
    Hover: i, j, d_repl, d_inter, gap (nats) with 95 % bootstrap CIs over prompts; for a pair undefined under the
    contract's per-layer definition, "n/a" and the reason."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    if scale not in ("linear", "log"):
        raise ValueError(f"scale must be 'linear' or 'log', got {scale!r}")
    left_m = result.replacement_directed() if directed else result.replacement()
    right_m = result.interchange()
    vals = np.concatenate([left_m[np.isfinite(left_m)], right_m[np.isfinite(right_m)]])
    if scale == "log":
        def tr(m):
            with np.errstate(all="ignore"):
                return np.where(np.isfinite(m), np.log10(np.maximum(m, LOG_FLOOR)), np.nan)
        zl, zr = tr(left_m), tr(right_m)
        zvals = np.log10(np.maximum(vals, LOG_FLOOR)) if vals.size else vals
    else:
        zl, zr, zvals = left_m, right_m, vals
    zmin = float(zvals.min()) if zvals.size else 0.0
    zmax = float(zvals.max()) if zvals.size else 1.0
    if zmax <= zmin:
        zmax = zmin + 1e-9
    lookup = _pair_lookup(result) if result.pairs else {}
    dci = _directed_ci(result) if directed else {}
    h_left, h_right = _hover_texts(result, lookup, directed, dci)
    L = result.num_layers
    axis = list(range(L))
    left_title = "replacement R[i][j] (slot i ← block j)" if directed else "replacement d_repl"
    fig = make_subplots(rows=1, cols=2, subplot_titles=(left_title, "interchange d_inter"),
                        horizontal_spacing=0.08)
    fig.add_trace(go.Heatmap(z=matrix_json(zl), x=axis, y=axis, coloraxis="coloraxis", text=h_left,
                             hovertemplate="%{text}<extra>replacement</extra>", name="replacement", xgap=1, ygap=1),
                  row=1, col=1)
    fig.add_trace(go.Heatmap(z=matrix_json(zr), x=axis, y=axis, coloraxis="coloraxis", text=h_right,
                             hovertemplate="%{text}<extra>interchange</extra>", name="interchange", xgap=1, ygap=1),
                  row=1, col=2)
    cbar: dict = {"title": {"text": "nats" + (" (log scale)" if scale == "log" else "")}}
    if scale == "log":
        tv, tt = _log_ticks(zmin, zmax)
        cbar.update(tickvals=tv, ticktext=tt)
    fig.update_layout(coloraxis={"colorscale": colorscale, "cmin": zmin, "cmax": zmax, "colorbar": cbar},
                      height=480, width=980)
    layer_axes(fig, L, "block j" if directed else "layer j", "slot i" if directed else "layer i", row=1, col=1)
    layer_axes(fig, L, row=1, col=2)
    fig.update_layout(plot_bgcolor="white")
    return stamp(fig, "Swap-KL by protocol (lower = more redundant)", caption or contract_caption(result),
                  extra_top=18)


def gap_heatmap(result, colorscale: str = "RdBu_r", caption: str | None = None):
    """``d_repl - d_inter`` [L, L] (nats) on a diverging colour scale centred on 0 (``zmid=0``); NaN blank.
    Positive (red) = replacement sees the pair as less redundant than interchange does."""
    import plotly.graph_objects as go

    g = result.gap()
    lookup = _pair_lookup(result) if result.pairs else {}
    L = result.num_layers
    text = [["" for _ in range(L)] for _ in range(L)]
    for (a, b), row in lookup.items():
        s = (f"i = {a}, j = {b}<br>gap = {fmt_number(row['gap'])}{fmt_ci(row.get('gap_lo'), row.get('gap_hi'))} nats<br>"
             f"d_repl = {fmt_number(row['d_repl'])}, d_inter = {fmt_number(row['d_inter'])} nats<br>KL ratio d_inter/d_repl = "
             f"{fmt_number(row['kl_ratio'], 3)}")
        text[a][b] = text[b][a] = s
    fin = g[np.isfinite(g)]
    amp = float(np.abs(fin).max()) if fin.size else 1.0
    fig = go.Figure(go.Heatmap(z=matrix_json(g), x=list(range(L)), y=list(range(L)), zmid=0, colorscale=colorscale,
                               zmin=-amp if amp > 0 else None, zmax=amp if amp > 0 else None, text=text,
                               hovertemplate="%{text}<extra>gap</extra>", xgap=1, ygap=1,
                               colorbar={"title": {"text": "d_repl − d_inter (nats)"}}))
    layer_axes(fig, L)
    fig.update_layout(height=480, width=560, plot_bgcolor="white")
    return stamp(fig, "Protocol gap d_repl − d_inter", caption or contract_caption(result))


def pair_distribution(result, i: int, j: int, caption: str | None = None):
    """Per-prompt KL (nats) of pair (i, j) under ``M[i<-j]`` (R[i][j]), ``M[j<-i]`` (R[j][i]) and
    ``M[i<->j]`` (interchange): one box per protocol with every prompt as a point; means as diamonds (trace
    "mean") and as the box's dashed line."""
    import plotly.graph_objects as go

    a, b = sorted((int(i), int(j)))
    if (a, b) not in result.per_prompt["inter"]:
        raise SwapklError(f"pair ({a}, {b}) was not computed under this contract")
    series = [(f"R[{a}][{b}]: slot {a} ← block {b}", result.per_prompt["repl"][(a, b)], "#1f77b4"),
              (f"R[{b}][{a}]: slot {b} ← block {a}", result.per_prompt["repl"][(b, a)], "#6baed6"),
              (f"interchange {a}↔{b}", result.per_prompt["inter"][(a, b)], "#d62728")]
    fig = go.Figure()
    names, means = [], []
    for name, v, col in series:
        v = np.asarray(v, dtype=float)
        fig.add_trace(go.Box(y=v.tolist(), name=name, boxpoints="all", jitter=0.35, pointpos=0, boxmean=True,
                             marker={"color": col}, line={"color": col},
                             hovertemplate="%{y:.4g} nats<extra>" + name + "</extra>"))
        names.append(name)
        means.append(float(v.mean()))
    fig.add_trace(go.Scatter(x=names, y=means, mode="markers", name="mean",
                             marker={"symbol": "diamond", "size": 12, "color": "black"},
                             hovertemplate="mean %{y:.4g} nats<extra></extra>"))
    fig.update_layout(yaxis_title="KL(base ‖ variant) per prompt (nats)", showlegend=False, height=420, width=640)
    return stamp(fig, f"Per-prompt swap-KL of pair ({a}, {b}), {len(series[0][1])} prompts",
                  caption or contract_caption(result))


def is_adjacent_only(result) -> bool:
    """True when every scored pair is adjacent (``|i-j| = 1``): the heatmaps would be blank but for a thin
    diagonal, so the depth profile (:func:`depth_profile`) is the figure to lead with."""
    return bool(result.pairs) and all(j - i == 1 for i, j in result.pairs)


def depth_profile(result, verdict: dict | None = None, directed: bool = False, bands: bool = True,
                  log_y: bool = True, caption: str | None = None):
    """Swap-KL of the adjacent pairs against layer depth: ``d_repl`` and ``d_inter`` (nats) of pair (i, i+1)
    at x = i + 0.5 (the boundary between the two layers), one line per protocol on one chart.

    ``bands``: 95 % bootstrap CI bands over prompts (traces ``"<protocol> band"``); ``directed``: the two
    directed replacement means ``R[i][i+1]`` (slot i ← block i+1) and ``R[i+1][i]`` are drawn too (otherwise
    they are in the legend, hidden until clicked); dashed lines at the strong (0.05) and conditional (0.10 nats)
    thresholds; the best pair of each protocol marked with a star; ``verdict`` (a
    :func:`swapkl.scoring.verdict.regime_verdict` dict) in the title.  ``log_y``: KLs span decades, so
    the y axis is logarithmic by default (values <= 0 drawn at :data:`LOG_FLOOR`, hover shows the true value).
    Only adjacent pairs are drawn (a wider pair set is the heatmaps' job)."""
    import plotly.graph_objects as go

    table = result.pair_table(ci=bands)
    adj = table[table["j"] - table["i"] == 1].sort_values("i") if not table.empty else table
    fig = go.Figure()
    if adj.empty:
        return stamp(fig, "Swap-KL by layer depth (adjacent pairs)", caption or contract_caption(result))
    x = [float(i) + 0.5 for i in adj["i"]]
    labels = [f"{int(i)}–{int(j)}" for i, j in zip(adj["i"], adj["j"])]
    pair_ids = [[int(i), int(j)] for i, j in zip(adj["i"], adj["j"])]  # a click names its pair (views.links)

    def yv(vals):
        return [max(float(v), LOG_FLOOR) if log_y else float(v) for v in vals]

    for name, col, colour, width in (("replacement", "d_repl", PROTOCOL_COLOURS["replacement"], 3.0),
                                     ("interchange", "d_inter", PROTOCOL_COLOURS["interchange"], 3.0)):
        if bands and f"{col}_lo" in adj.columns:
            lo, hi = yv(adj[f"{col}_lo"]), yv(adj[f"{col}_hi"])
            fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", mode="lines", line={"width": 0},
                                     fillcolor=rgba(colour, 0.15), name=f"{name} band", legendgroup=name,
                                     showlegend=False, hoverinfo="skip", meta={"band": "95 % CI over prompts"}))
        ci = [fmt_ci(a, b) for a, b in zip(adj.get(f"{col}_lo", [None] * len(adj)), adj.get(f"{col}_hi", [None] * len(adj)))]
        text = [f"pair {lab}<br>{col} = {fmt_number(v)}{c} nats" for lab, v, c in zip(labels, adj[col], ci)]
        fig.add_trace(go.Scatter(x=x, y=yv(adj[col]), mode="lines+markers", name=f"{name} {col}", legendgroup=name,
                                 line={"color": colour, "width": width}, marker={"size": 7, "color": colour},
                                 text=text, hovertemplate="%{text}<extra></extra>", meta={"protocol": name},
                                 customdata=pair_ids))
        best = int(np.argmin(adj[col].to_numpy()))
        fig.add_trace(go.Scatter(x=[x[best]], y=yv([adj[col].iloc[best]]), mode="markers+text",
                                 marker={"symbol": "star", "size": 18, "color": colour, "line": {"width": 1, "color": "black"}},
                                 text=[f"best {name}: {labels[best]}"],
                                 textposition="top center" if name == "replacement" else "bottom center",
                                 textfont={"color": colour, "size": 11}, name=f"best {name} pair", legendgroup=name,
                                 showlegend=False, hovertemplate=f"best {name} pair {labels[best]}: "
                                 f"{fmt_number(adj[col].iloc[best])} nats<extra></extra>", meta={"best": labels[best]}))
    for col, name, dash in (("R_ij", "R[i][i+1] (slot i ← block i+1)", "dot"),
                            ("R_ji", "R[i+1][i] (slot i+1 ← block i)", "dashdot")):
        fig.add_trace(go.Scatter(x=x, y=yv(adj[col]), mode="lines+markers", name=name, visible=True if directed else "legendonly",
                                 line={"color": PROTOCOL_COLOURS["replacement"], "width": 1.2, "dash": dash}, marker={"size": 4},
                                 text=[f"pair {lab}<br>{name} = {fmt_number(v)} nats" for lab, v in zip(labels, adj[col])],
                                 hovertemplate="%{text}<extra></extra>", meta={"directed": col}, customdata=pair_ids))
    for thr, what in ((STRONG, "strong"), (CONDITIONAL, "conditional")):
        fig.add_hline(y=thr, line={"color": "#555", "width": 1, "dash": "dash"},
                      annotation_text=f"{what} < {thr:g} nats", annotation_position="bottom right",
                      annotation_font_size=10)
    L = result.num_layers
    fig.update_xaxes(title_text="layer depth (pair i–i+1 drawn between layers i and i+1)", range=[0, L - 1],
                     autorange=False, tickmode="array", tickvals=layer_ticks(L))
    fig.update_yaxes(title_text="swap-KL, nats" + (" (log scale)" if log_y else ""), type="log" if log_y else "linear")
    fig.update_layout(height=460, width=980, hovermode="x unified", plot_bgcolor="white",
                      legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    title = "Swap-KL by layer depth (adjacent pairs; lower = more redundant)"
    if verdict:
        title += f" — {verdict['regime']} regime, prefer {verdict['prefer']}"
    return stamp(fig, title, caption or contract_caption(result))


def profile_frame(num_layers: int | None = None):
    """The empty frame of :func:`depth_profile` -- axes, the 0.05 / 0.10 nats thresholds (definitions, not
    results) and a note where the two protocols' curves will appear -- for a page with nothing computed yet.
    It holds no number measured on any model, so it carries no contract.  (Drawing it also loads the browser's
    plot library before the first result arrives: a cached result then shows in a fraction of a second.)"""
    import plotly.graph_objects as go

    fig = go.Figure()
    for thr, what in ((STRONG, "strong"), (CONDITIONAL, "conditional")):
        fig.add_hline(y=thr, line={"color": "#555", "width": 1, "dash": "dash"},
                      annotation_text=f"{what} < {thr:g} nats", annotation_position="bottom right",
                      annotation_font_size=10)
    fig.add_annotation(text="press Compute: replacement and interchange swap-KL of each adjacent pair appear "
                            "here, against layer depth", xref="paper", yref="paper", x=0.5, y=0.5,
                       showarrow=False, font={"size": 13, "color": "#777"})
    fig.update_xaxes(title_text="layer depth", range=[0, (num_layers or 30) - 1], showgrid=True, gridcolor="#eee")
    fig.update_yaxes(title_text="swap-KL, nats (log scale)", type="log", range=[-3, 1], showgrid=True,
                     gridcolor="#eee")
    fig.update_layout(height=300, plot_bgcolor="white", margin={"t": 30, "b": 40},
                      title={"text": "Swap-KL by layer depth (adjacent pairs; lower = more redundant)",
                             "font": {"size": 14}})
    return fig


def top_pairs_table(result, k: int = 10):
    """pandas DataFrame of the k most redundant pairs (lowest swap-KL, nats) under each protocol side by side.

    Columns: ``rank`` (1..k), ``repl_pair`` ("i-j"), ``d_repl``, ``inter_pair``, ``d_inter`` (nats),
    ``repl_not_in_inter_top`` (the replacement pair at this rank is outside interchange's top k),
    ``inter_not_in_repl_top`` (vice versa), ``disagree`` (either).  Ties are broken by pair order (adjacent
    pairs first, then by i)."""
    import pandas as pd

    df = result.pair_table(ci=False)
    cols = ["rank", "repl_pair", "d_repl", "inter_pair", "d_inter", "repl_not_in_inter_top",
            "inter_not_in_repl_top", "disagree"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    k = max(1, min(int(k), len(df)))
    r = df.sort_values("d_repl", kind="stable").head(k)
    t = df.sort_values("d_inter", kind="stable").head(k)
    rp = [(int(a), int(b)) for a, b in zip(r["i"], r["j"])]
    ip = [(int(a), int(b)) for a, b in zip(t["i"], t["j"])]
    rs, is_ = set(rp), set(ip)
    rows = []
    for n in range(k):
        r_out = rp[n] not in is_
        i_out = ip[n] not in rs
        rows.append({"rank": n + 1, "repl_pair": f"{rp[n][0]}-{rp[n][1]}", "d_repl": float(r["d_repl"].iloc[n]),
                     "inter_pair": f"{ip[n][0]}-{ip[n][1]}", "d_inter": float(t["d_inter"].iloc[n]),
                     "repl_not_in_inter_top": r_out, "inter_not_in_repl_top": i_out, "disagree": r_out or i_out})
    return pd.DataFrame(rows, columns=cols)
