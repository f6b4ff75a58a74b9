"""Figures and tables shared by the dashboard and the HTML report (plotly + pandas; no Streamlit).

Every figure carries the evaluation contract (:func:`contract_caption`) as its subtitle and in
``fig.layout.meta["contract"]``; every export (:func:`figure_html`, :func:`table_csv`) carries it too.

Units: swap-KL values are nats (``KL(base || variant)``, mean over positions then prompts); ΔPPL is in % of the
baseline perplexity; ``kl_to_base`` is nats per scored token.  Matrices are L x L with NaN where a pair was not
computed; plotted cells for NaN are blank (``null`` in the figure JSON), never zero.
"""
from __future__ import annotations

import html as _html
import json
import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from swapkl import methods as M
from swapkl.contract import Provenance
from swapkl.curves import curves_provenance
from swapkl.results import CONDITIONAL, matrix_json, STRONG
from swapkl.trajectory import trajectory_provenance
from swapkl.errors import SwapklError

# Deferred imports: plotly and pandas are imported by the functions that draw or tabulate: the CLI and the
# dashboard's first paint import this module without them.

SEP = " · "
LOG_FLOOR = 1e-6  # nats: values <= 0 are drawn at this floor on the log scale (hover shows the true value)

# the two protocols' colours in the score figures (the guided methods' curves use the same, from their registry style)
PROTOCOL_COLOURS = {"replacement": "#1f77b4", "interchange": "#d62728"}
BASELINE_COLOURS = ["#7f7f7f", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e"]


# ============================================================================================ captions
def _fmt_model(m: dict | None) -> str:
    if not m:
        return "model ?"
    name = m.get("display") or m.get("id") or m.get("name_or_path") or m.get("name") or "?"
    rev = m.get("revision")
    parts = [str(name)]
    if rev and f"@{rev}" not in str(name):
        parts.append(f"@{rev}")
    commit = m.get("commit")
    fp = m.get("fingerprint") or m.get("sha256") or m.get("weights_sha256")
    extra = ""
    if commit:
        extra = f" (commit {str(commit)[:8]})"
    elif fp and not rev:
        extra = f" (fp {str(fp)[:8]})"
    return "".join(parts) + extra


def _fmt_evaluator(ev: dict | None) -> str:
    if not ev:
        return ""
    if isinstance(ev, str):
        return f"evaluator {ev}"
    s = f"evaluator {ev.get('name', '?')}"
    bits = []
    if ev.get("max_words"):
        bits.append(f"{ev['max_words']} words")
    if ev.get("window"):
        bits.append(f"window {ev['window']}/stride {ev.get('stride', '?')}")
    if ev.get("drop_first_target"):
        bits.append("first target dropped")
    return s + (f" ({', '.join(bits)})" if bits else "")


def _contract_parts(c: dict) -> list[str]:
    parts = []
    if c.get("pairs") is not None:
        parts.append(f"pairs {c['pairs']}")
    if c.get("prompts") is not None and c.get("tokens") is not None:
        parts.append(f"{c['prompts']} prompts × {c['tokens']} tokens")
    if c.get("positions"):
        parts.append(f"positions {c['positions']}")
    if c.get("aggregation"):
        parts.append(f"aggregation {c['aggregation']}")
    if c.get("dtype"):
        parts.append(str(c["dtype"]))
    corpus = c.get("corpus_label") or c.get("corpus")
    if corpus:
        parts.append(f"corpus {corpus}")
    if c.get("seed") is not None:
        parts.append(f"seed {c['seed']}")
    return parts


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


def contract_caption(source: Any, evaluator: dict | str | None = None) -> str:
    """One line stating the evaluation contract of ``source``: a :class:`~swapkl.contract.Provenance`, or any
    result that gives one with ``provenance()`` (SwapResult, CurvesResult, Trajectory, Recommendation, Contract).
    A dict is not guessed at: build the result with its ``from_dict``, or use :func:`swapkl.curves.curves_provenance`
    / :func:`swapkl.trajectory.trajectory_provenance` for a curves or trajectory dict.

    Gives: model (display/id, revision or a fingerprint prefix), pairs, prompts × tokens, positions,
    aggregation, dtype, corpus label, seed, the extra pieces (budget, spacing), and the perplexity evaluator when
    the source has one (``evaluator`` overrides it)."""
    prov = source
    if not isinstance(prov, Provenance):
        get = getattr(source, "provenance", None)
        if not callable(get):
            raise TypeError(f"contract_caption needs a Provenance or a result with provenance(), not "
                            f"{type(source).__name__}")
        prov = get()
    model = {"display": prov.model} if isinstance(prov.model, str) else prov.model
    parts = [_fmt_model(model)] if model is not None else []
    parts += _contract_parts(prov.contract or {}) + list(prov.extra)
    ev = evaluator or prov.evaluator
    if ev:
        parts.append(_fmt_evaluator(ev))
    return SEP.join(parts)


def _wrap_caption(caption: str, width: int = 110) -> str:
    """Break a long caption at a separator for display (the pieces stay intact)."""
    if len(caption) <= width:
        return caption
    pieces = caption.split(SEP)
    lines, cur = [], ""
    for p in pieces:
        if cur and len(cur) + len(SEP) + len(p) > width:
            lines.append(cur)
            cur = p
        else:
            cur = f"{cur}{SEP}{p}" if cur else p
    lines.append(cur)
    return "<br>".join(lines)


def _stamp(fig, title: str, caption: str, extra_top: int = 0):
    """Title + contract subtitle + ``layout.meta['contract']`` (other ``layout.meta`` keys are kept)."""
    n_lines = _wrap_caption(caption).count("<br>") + 1
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    fig.update_layout(title={"text": title, "subtitle": {"text": _wrap_caption(caption), "font": {"size": 11}}},
                      meta=dict(meta, contract=caption), margin={"t": 72 + 15 * n_lines + extra_top})
    return fig


# ============================================================================================ helpers
def _f(v, nd: int = 4) -> str:
    if v is None:
        return "–"
    try:
        v = float(v)
    except (TypeError, ValueError):
        return str(v)
    if not math.isfinite(v):
        return "–"
    if v != 0 and (abs(v) < 10 ** -(nd - 1) or abs(v) >= 1e4):
        return f"{v:.{nd - 1}e}"
    return f"{v:.{nd}f}"


def _ci(lo, hi) -> str:
    if lo is None or hi is None or not (math.isfinite(float(lo)) and math.isfinite(float(hi))):
        return ""
    return f" [{_f(lo)}, {_f(hi)}]"


def _pair_lookup(result) -> dict:
    """{(i, j) with i < j: pair_table row as dict} (bootstrap CIs when the result has > 1 prompt)."""
    df = result.pair_table(ci=True)
    return {(int(r["i"]), int(r["j"])): r for r in df.to_dict("records")}


def _directed_ci(result) -> dict:
    """{(i, j): (lo, hi)} 95 % bootstrap CI (prompts resampled) of each directed mean R[i][j], nats."""
    if result.num_prompts < 2:
        return {}
    idx = result._boot_idx()
    out = {}
    for key, v in result.per_prompt["repl"].items():
        b = np.asarray(v)[idx].mean(-1)
        out[tuple(key)] = (float(np.percentile(b, 2.5)), float(np.percentile(b, 97.5)))
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
                continue
            common = (f"d_repl = {_f(row['d_repl'])}{_ci(row.get('d_repl_lo'), row.get('d_repl_hi'))} nats<br>"
                      f"d_inter = {_f(row['d_inter'])}{_ci(row.get('d_inter_lo'), row.get('d_inter_hi'))} nats<br>"
                      f"gap = {_f(row['gap'])}{_ci(row.get('gap_lo'), row.get('gap_hi'))} nats")
            if directed:
                lo_hi = dci.get((i, j), (None, None))
                head = (f"slot i = {i}, block j = {j}<br>R[{i}][{j}] = {_f(R[i, j])}{_ci(*lo_hi)} nats "
                        f"(slot {i} runs block {j})<br>R[{j}][{i}] = {_f(R[j, i])} nats<br>")
            else:
                head = f"i = {a}, j = {b}<br>R[{a}][{b}] = {_f(R[a, b])}, R[{b}][{a}] = {_f(R[b, a])} nats<br>"
            left[i][j] = head + common
            right[i][j] = f"i = {a}, j = {b}<br>" + common
    return left, right


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


# ============================================================================================ heatmaps
def heatmaps(result, scale: str = "linear", directed: bool = False, colorscale: str = "Viridis",
             caption: str | None = None):
    """Replacement and interchange swap-KL side by side on ONE shared colour scale.

    Left: ``d_repl`` [L, L] (symmetric; or with ``directed=True`` the directed means ``R[i][j]``, rows = slot i,
    columns = block j); right: ``d_inter`` [L, L].  Both traces use the layout's ``coloraxis`` (same
    ``cmin``/``cmax``).  ``scale="log"``: the cells hold log10 of the values (nats; values <= 0 drawn at
    ``LOG_FLOOR``) and the colour bar ticks are labelled in nats.  NaN = not computed = blank.
    Hover: i, j, d_repl, d_inter, gap (nats) with 95 % bootstrap CIs over prompts."""
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
    fig.update_yaxes(autorange="reversed", title_text="slot i" if directed else "layer i", dtick=1 if L <= 32 else None,
                     row=1, col=1)
    fig.update_xaxes(title_text="block j" if directed else "layer j", dtick=1 if L <= 32 else None, row=1, col=1)
    fig.update_yaxes(autorange="reversed", title_text="layer i", dtick=1 if L <= 32 else None, row=1, col=2)
    fig.update_xaxes(title_text="layer j", dtick=1 if L <= 32 else None, row=1, col=2)
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False)
    fig.update_layout(plot_bgcolor="white")
    return _stamp(fig, "Swap-KL by protocol (lower = more redundant)", caption or contract_caption(result),
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
        s = (f"i = {a}, j = {b}<br>gap = {_f(row['gap'])}{_ci(row.get('gap_lo'), row.get('gap_hi'))} nats<br>"
             f"d_repl = {_f(row['d_repl'])}, d_inter = {_f(row['d_inter'])} nats<br>KL ratio d_inter/d_repl = "
             f"{_f(row['kl_ratio'], 3)}")
        text[a][b] = text[b][a] = s
    fin = g[np.isfinite(g)]
    amp = float(np.abs(fin).max()) if fin.size else 1.0
    fig = go.Figure(go.Heatmap(z=matrix_json(g), x=list(range(L)), y=list(range(L)), zmid=0, colorscale=colorscale,
                               zmin=-amp if amp > 0 else None, zmax=amp if amp > 0 else None, text=text,
                               hovertemplate="%{text}<extra>gap</extra>", xgap=1, ygap=1,
                               colorbar={"title": {"text": "d_repl − d_inter (nats)"}}))
    fig.update_yaxes(autorange="reversed", title_text="layer i", dtick=1 if L <= 32 else None)
    fig.update_xaxes(title_text="layer j", dtick=1 if L <= 32 else None)
    fig.update_layout(height=480, width=560, plot_bgcolor="white")
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False)
    return _stamp(fig, "Protocol gap d_repl − d_inter", caption or contract_caption(result))


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
    return _stamp(fig, f"Per-prompt swap-KL of pair ({a}, {b}), {len(series[0][1])} prompts",
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
    :func:`swapkl.verdict.regime_verdict` dict) in the title.  ``log_y``: KLs span decades, so
    the y axis is logarithmic by default (values <= 0 drawn at :data:`LOG_FLOOR`, hover shows the true value).
    Only adjacent pairs are drawn (a wider pair set is the heatmaps' job)."""
    import plotly.graph_objects as go

    table = result.pair_table(ci=bands)
    adj = table[table["j"] - table["i"] == 1].sort_values("i") if not table.empty else table
    fig = go.Figure()
    if adj.empty:
        return _stamp(fig, "Swap-KL by layer depth (adjacent pairs)", caption or contract_caption(result))
    x = [float(i) + 0.5 for i in adj["i"]]
    labels = [f"{int(i)}–{int(j)}" for i, j in zip(adj["i"], adj["j"])]

    def yv(vals):
        return [max(float(v), LOG_FLOOR) if log_y else float(v) for v in vals]

    for name, col, colour, width in (("replacement", "d_repl", PROTOCOL_COLOURS["replacement"], 3.0),
                                     ("interchange", "d_inter", PROTOCOL_COLOURS["interchange"], 3.0)):
        if bands and f"{col}_lo" in adj.columns:
            lo, hi = yv(adj[f"{col}_lo"]), yv(adj[f"{col}_hi"])
            fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", mode="lines", line={"width": 0},
                                     fillcolor=_rgba(colour, 0.15), name=f"{name} band", legendgroup=name,
                                     showlegend=False, hoverinfo="skip", meta={"band": "95 % CI over prompts"}))
        ci = [_ci(a, b) for a, b in zip(adj.get(f"{col}_lo", [None] * len(adj)), adj.get(f"{col}_hi", [None] * len(adj)))]
        text = [f"pair {lab}<br>{col} = {_f(v)}{c} nats" for lab, v, c in zip(labels, adj[col], ci)]
        fig.add_trace(go.Scatter(x=x, y=yv(adj[col]), mode="lines+markers", name=f"{name} {col}", legendgroup=name,
                                 line={"color": colour, "width": width}, marker={"size": 7, "color": colour},
                                 text=text, hovertemplate="%{text}<extra></extra>", meta={"protocol": name}))
        best = int(np.argmin(adj[col].to_numpy()))
        fig.add_trace(go.Scatter(x=[x[best]], y=yv([adj[col].iloc[best]]), mode="markers+text",
                                 marker={"symbol": "star", "size": 18, "color": colour, "line": {"width": 1, "color": "black"}},
                                 text=[f"best {name}: {labels[best]}"],
                                 textposition="top center" if name == "replacement" else "bottom center",
                                 textfont={"color": colour, "size": 11}, name=f"best {name} pair", legendgroup=name,
                                 showlegend=False, hovertemplate=f"best {name} pair {labels[best]}: "
                                 f"{_f(adj[col].iloc[best])} nats<extra></extra>", meta={"best": labels[best]}))
    for col, name, dash in (("R_ij", "R[i][i+1] (slot i ← block i+1)", "dot"),
                            ("R_ji", "R[i+1][i] (slot i+1 ← block i)", "dashdot")):
        fig.add_trace(go.Scatter(x=x, y=yv(adj[col]), mode="lines+markers", name=name, visible=True if directed else "legendonly",
                                 line={"color": PROTOCOL_COLOURS["replacement"], "width": 1.2, "dash": dash}, marker={"size": 4},
                                 text=[f"pair {lab}<br>{name} = {_f(v)} nats" for lab, v in zip(labels, adj[col])],
                                 hovertemplate="%{text}<extra></extra>", meta={"directed": col}))
    for thr, what in ((STRONG, "strong"), (CONDITIONAL, "conditional")):
        fig.add_hline(y=thr, line={"color": "#555", "width": 1, "dash": "dash"},
                      annotation_text=f"{what} < {thr:g} nats", annotation_position="bottom right",
                      annotation_font_size=10)
    L = result.num_layers
    fig.update_xaxes(title_text="layer depth (pair i–i+1 drawn between layers i and i+1)", range=[0, L - 1],
                     dtick=1 if L <= 32 else None)
    fig.update_yaxes(title_text="swap-KL, nats" + (" (log scale)" if log_y else ""), type="log" if log_y else "linear")
    fig.update_layout(height=460, width=980, hovermode="x unified", plot_bgcolor="white",
                      legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(showgrid=True, gridcolor="#eee")
    fig.update_yaxes(showgrid=True, gridcolor="#eee")
    title = "Swap-KL by layer depth (adjacent pairs; lower = more redundant)"
    if verdict:
        title += f" — {verdict['regime']} regime, prefer {verdict['prefer']}"
    return _stamp(fig, title, caption or contract_caption(result))


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


def _style(m: str, k: int) -> dict:
    """The line style of method ``m`` (its registry style; the k-th baseline colour, dotted, otherwise)."""
    spec = M.find(m)
    if spec is not None and spec.style:
        return {key: v for key, v in spec.style.items() if key != "marker"}
    return {"color": BASELINE_COLOURS[(k + 1) % len(BASELINE_COLOURS)], "width": 1.5, "dash": "dot"}


def _marker_size(m: str) -> int:
    spec = M.find(m)
    return int((spec.style or {}).get("marker", 5)) if spec is not None else 5


def _rgba(hex_col: str, alpha: float) -> str:
    h = hex_col.lstrip("#")
    r, g, b = (int(h[x:x + 2], 16) for x in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


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
        st = _style(m, k)
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
                                         line={"width": 0}, fillcolor=_rgba(st["color"], 0.15 if _guided(m) else 0.08),
                                         name=f"{m} band", legendgroup=m, showlegend=False, hoverinfo="skip",
                                         meta={"band": band_kind}))
        hover = []
        for e in entries:
            s = f"n = {e['n']}<br>removed {_removed_str(e)}<br>ΔPPL {_f(e['delta_pct'], 2)} %"
            ci = e.get("delta_pct_ci")
            if ci and None not in ci:
                s += f" [{_f(ci[0], 2)}, {_f(ci[1], 2)}]"
            if e.get("delta_pct_min") is not None:
                s += f" (seeds: {_f(e['delta_pct_min'], 2)} … {_f(e['delta_pct_max'], 2)})"
            if e.get("ppl") is not None:
                s += f"<br>PPL {_f(e['ppl'], 3)}"
            hover.append(s)
        fig.add_trace(go.Scatter(x=ns, y=[float(e["delta_pct"]) for e in entries], mode="lines+markers",
                                 name=_label(m) + (" (mean of seeds)" if _seeded(m) else ""), legendgroup=m,
                                 line=st, marker={"size": _marker_size(m), "color": st["color"]},
                                 text=hover, hovertemplate="%{text}<extra>" + _label(m) + "</extra>",
                                 meta={"method": m}))
    base = d.get("baseline_ppl")
    title = "ΔPPL after layer removal" + (f" (baseline PPL {_f(base, 3)})" if base is not None else "")
    fig.add_hline(y=0, line={"color": "black", "width": 0.8})
    rng = None if full_range else _focus_range(all_methods, chosen)
    if rng is not None:
        fig.update_yaxes(range=list(rng))
        for k, m in enumerate(chosen):
            off = [e for e in all_methods[m] if e.get("delta_pct") is not None and float(e["delta_pct"]) > rng[1]]
            if not off:
                continue
            col = _style(m, k)["color"]
            top = rng[1] - 0.03 * (rng[1] - rng[0])
            fig.add_trace(go.Scatter(x=[int(e["n"]) for e in off], y=[top] * len(off), mode="markers+text",
                                     marker={"symbol": "triangle-up", "size": 11, "color": col},
                                     text=[f"{_f(e['delta_pct'], 1)} %" for e in off], textposition="bottom center",
                                     textfont={"size": 10, "color": col}, name=f"{m} off scale", legendgroup=m,
                                     showlegend=False, hovertemplate="%{text} (above the range shown)<extra>"
                                     + _label(m) + "</extra>", meta={"off_scale": m}))
    fig.update_layout(meta={"focus_range": list(rng) if rng else None})
    fig.update_layout(xaxis_title="layers removed n", yaxis_title="ΔPPL (% of baseline)", height=460, width=760,
                      legend={"orientation": "v"}, hovermode="closest")
    fig.update_xaxes(dtick=1)
    return _stamp(fig, title, caption or contract_caption(curves_provenance(d)))


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
        st = _style(m, k)
        fig.add_trace(go.Scatter(x=[int(e["n"]) for e in entries], y=[float(e["kl_to_base"]) for e in entries],
                                 mode="lines+markers", name=_label(m), line=st, meta={"method": m},
                                 text=[_removed_str(e) for e in entries],
                                 hovertemplate="n = %{x}<br>removed %{text}<br>KL %{y:.4g} nats<extra>"
                                               + _label(m) + "</extra>"))
    fig.update_layout(xaxis_title="layers removed n", yaxis_title="KL(base ‖ pruned), nats per token", height=420,
                      width=760)
    fig.update_xaxes(dtick=1)
    return _stamp(fig, "Distance of the pruned model from the base model", caption or contract_caption(curves_provenance(d)))


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


# ============================================================================================ trajectory
def _traj_frames(stats_df, depth_df):
    import pandas as pd

    if isinstance(stats_df, dict):  # a Trajectory.to_dict() dict
        d = stats_df
        stats_df = pd.DataFrame(d.get("summary") or [])
        if depth_df is None and d.get("gap_vs_depth"):
            depth_df = pd.DataFrame(d["gap_vs_depth"])
    elif hasattr(stats_df, "summary") and hasattr(stats_df, "depth") and not isinstance(stats_df, pd.DataFrame):
        traj = stats_df
        stats_df = traj.summary()
        if depth_df is None and traj.results:
            depth_df = traj.depth()
    stats_df = stats_df.copy()
    for old, new in (("ratio_mean", "kl_ratio_mean"), ("ratio_median", "kl_ratio_median")):
        if old in stats_df.columns and new not in stats_df.columns:
            stats_df[new] = stats_df[old]
    return stats_df, depth_df


def _steps(df) -> tuple[list, str]:
    if "step" in df.columns and df["step"].notna().all():
        return [int(s) for s in df["step"]], "training step"
    labels = df["label"].tolist() if "label" in df.columns else None
    return (labels if labels and all(labels) else list(range(len(df)))), "checkpoint"


def _col(df, name) -> list:
    import pandas as pd

    return [None if pd.isna(v) or not math.isfinite(float(v)) else float(v) for v in df[name].tolist()]


def trajectory_figures(stats_df, depth_df=None, caption: str | None = None, log_x: bool | None = None) -> dict:
    """Figures of the protocol gap over training, from :func:`swapkl.trajectory.checkpoint_stats` (one row per
    checkpoint: ``step``, ``gap_mean``/``gap_median``/``gap_p75``/``gap_max`` nats, ``ratio_mean``/``ratio_median``
    or ``kl_ratio_mean``/``kl_ratio_median``, ``pearson``) and :func:`swapkl.trajectory.gap_vs_depth` (``depth`` in
    [0, 1], ``gap`` nats, ``i``, ``j``).  Also accepts a ``Trajectory`` or its ``to_json()`` dict.

    Returns ``{"gap": gap distribution vs step, "kl_ratio": KL ratio vs step, "pearson": Pearson r vs step,
    "depth": per-pair gap vs normalised depth at the last checkpoint}`` ("depth" only with depth data).
    ``log_x``: symlog-like x axis (default: when steps span more than two decades)."""
    import plotly.graph_objects as go

    if caption is None and isinstance(stats_df, dict):
        caption = contract_caption(trajectory_provenance(stats_df))
    stats, depth = _traj_frames(stats_df, depth_df)
    cap = caption or ""
    x, xtitle = _steps(stats)
    if log_x is None:
        pos = [v for v in x if isinstance(v, int) and v > 0]
        log_x = xtitle == "training step" and len(pos) >= 2 and max(pos) / min(pos) > 100 and 0 not in x
    figs = {}

    g = go.Figure()
    for name, dash, width in (("gap_mean", None, 3), ("gap_median", "dash", 2), ("gap_p75", "dot", 2),
                              ("gap_max", "dashdot", 1.5)):
        if name in stats.columns:
            g.add_trace(go.Scatter(x=x, y=_col(stats, name), mode="lines+markers", name=name.replace("gap_", ""),
                                   line={"dash": dash, "width": width},
                                   hovertemplate="%{x}: %{y:.4g} nats<extra>" + name + "</extra>"))
    g.add_hline(y=0, line={"color": "black", "width": 0.8})
    g.update_layout(xaxis_title=xtitle, yaxis_title="gap d_repl − d_inter (nats)", height=420, width=720)
    figs["gap"] = _stamp(g, "Protocol gap over training (distribution over pairs)", cap)

    r = go.Figure()
    for name, dash in (("kl_ratio_mean", None), ("kl_ratio_median", "dash")):
        if name in stats.columns:
            r.add_trace(go.Scatter(x=x, y=_col(stats, name), mode="lines+markers", name=name.replace("kl_ratio_", ""),
                                   line={"dash": dash}, hovertemplate="%{x}: %{y:.3f}<extra>" + name + "</extra>"))
    r.add_hline(y=1, line={"color": "black", "width": 0.8, "dash": "dot"})
    r.update_layout(xaxis_title=xtitle, yaxis_title="KL ratio d_inter / d_repl", height=420, width=720)
    figs["kl_ratio"] = _stamp(r, "KL ratio over training", cap)

    p = go.Figure()
    if "pearson" in stats.columns:
        p.add_trace(go.Scatter(x=x, y=_col(stats, "pearson"), mode="lines+markers", name="pearson",
                               hovertemplate="%{x}: r = %{y:.3f}<extra></extra>"))
    p.update_layout(xaxis_title=xtitle, yaxis_title="Pearson r (d_repl vs d_inter over pairs)",
                    yaxis_range=[-1.05, 1.05], height=420, width=720)
    figs["pearson"] = _stamp(p, "Agreement of the two protocols over training", cap)

    if log_x:
        for f in figs.values():
            f.update_xaxes(type="log")

    if depth is not None and len(depth):
        last = f" ({x[-1]})" if x else ""
        dfig = go.Figure(go.Scatter(
            x=[float(v) for v in depth["depth"]], y=[float(v) for v in depth["gap"]], mode="markers", name="pairs",
            text=[f"pair ({int(a)}, {int(b)})" for a, b in zip(depth["i"], depth["j"])],
            hovertemplate="%{text}<br>depth %{x:.2f}<br>gap %{y:.4g} nats<extra></extra>"))
        dfig.add_hline(y=0, line={"color": "black", "width": 0.8})
        dfig.update_layout(xaxis_title="normalised depth (i + j) / 2 / (L − 1)", yaxis_title="gap (nats)",
                           xaxis_range=[-0.03, 1.03], height=420, width=720)
        figs["depth"] = _stamp(dfig, "Per-pair gap vs depth at the last checkpoint" + last, cap)
    return figs


# ============================================================================================ exports
def figure_html(fig, caption: str | None = None, include_plotlyjs: bool = True) -> str:
    """A self-contained HTML page of one figure: plotly.js inlined once (no network needed), the contract
    caption (``caption``, else the figure's ``layout.meta['contract']``) as a visible line and in <title>."""
    cap = caption
    if cap is None:
        meta = fig.layout.meta
        if isinstance(meta, dict):
            cap = meta.get("contract")
    div = fig.to_html(full_html=False, include_plotlyjs=include_plotlyjs, config={"displaylogo": False})
    title = _html.escape(fig.layout.title.text or "swapkl figure") if fig.layout.title else "swapkl figure"
    cap_html = f'<p class="contract">contract: {_html.escape(cap)}</p>' if cap else ""
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{title}</title></head><body>\n{div}\n{cap_html}\n</body></html>\n")


def table_csv(df, caption) -> str:
    """CSV text of ``df`` whose first line is ``# contract: <caption>`` (``caption``: a string, or anything
    :func:`contract_caption` accepts)."""
    cap = caption if isinstance(caption, str) else contract_caption(caption)
    cap = cap.replace("\n", " ").replace("\r", " ")
    return f"# contract: {cap}\n" + df.to_csv(index=False)
