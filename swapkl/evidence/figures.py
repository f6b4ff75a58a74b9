"""The three evidence figures, from an evidence dict (:meth:`swapkl.evidence.run.EvidenceResult.to_dict`): the
agreement heatmap (Spearman ρ, CIs on hover), the ground-truth bars with each signal's rank overlaid, and the
stability strip (layers × n, selection frequency).  Each carries the contract caption (``layout.meta['contract']``).
Plotly only; no Streamlit, no torch."""
from __future__ import annotations

import numpy as np
from scipy import stats

from swapkl.evidence.report import caption

GT = ("ground_truth_ppl", "ground_truth_kl", "ground_truth_acc")


def _stamp(fig, title: str, cap: str):
    from swapkl.views.captions import stamp

    return stamp(fig, title, cap)


def agreement_heatmap(d: dict, cap: str | None = None):
    """Spearman ρ between every signal and the ground truths; hover: ρ [CI], τ [CI]."""
    import plotly.graph_objects as go

    names = list(d["signals"]) + [g for g in GT if g in d["agreement"]["spearman"]]
    ag = d["agreement"]
    z, text = [], []
    for a in names:
        row, trow = [], []
        for b in names:
            v = ag["spearman"][a][b]
            lo, hi = ag["spearman_ci"][a][b]
            t, (tlo, thi) = ag["kendall"][a][b], ag["kendall_ci"][a][b]
            row.append(v)
            ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
            tci = f" [{tlo:.2f}, {thi:.2f}]" if tlo is not None else ""
            trow.append(f"{a} vs {b}<br>ρ = {v:.2f}{ci}<br>τ = {t:.2f}{tci}" if v is not None else f"{a} vs {b}: –")
        z.append(row)
        text.append(trow)
    fig = go.Figure(go.Heatmap(z=z, x=names, y=names, zmin=-1, zmax=1, colorscale="RdBu", text=text,
                               hovertemplate="%{text}<extra></extra>", colorbar={"title": "ρ"}))
    fig.update_yaxes(autorange="reversed")
    return _stamp(fig, "Rank agreement (Spearman ρ; hover for the 95 % CIs and Kendall τ)", cap or caption(d))


def ground_truth_bars(d: dict, cap: str | None = None):
    """Held-out ΔPPL % of removing each layer alone (error bars: 95 % CI) with each signal's rank of the layer
    (1 = safest) as markers on a second axis."""
    import plotly.graph_objects as go

    g = d["ground_truth"]
    layers = d["layers"]
    dp = np.asarray(g["delta_ppl_pct"], float)
    ci = np.asarray(g["delta_ppl_pct_ci"], float)
    fig = go.Figure(go.Bar(x=layers, y=dp.tolist(), name="ΔPPL % (held out)", marker_color="#999999",
                           error_y={"type": "data", "symmetric": False, "array": (ci[:, 1] - dp).tolist(),
                                    "arrayminus": (dp - ci[:, 0]).tolist()},
                           hovertemplate="layer %{x}: ΔPPL %{y:.2f} %<extra></extra>"))
    truth_rank = stats.rankdata(dp)
    fig.add_trace(go.Scatter(x=layers, y=truth_rank.tolist(), yaxis="y2", mode="lines", name="ground-truth rank",
                             line={"color": "black", "dash": "dot"}))
    for name, v in d["signals"].items():
        v = np.asarray([np.nan if x is None else x for x in v], float)
        r = np.where(np.isfinite(v), stats.rankdata(np.where(np.isfinite(v), v, np.inf)), np.nan)
        fig.add_trace(go.Scatter(x=layers, y=[None if not np.isfinite(x) else float(x) for x in r], yaxis="y2", mode="markers", name=f"{name} rank",
                                 hovertemplate=f"{name}: layer %{{x}} rank %{{y}}<extra></extra>"))
    fig.update_layout(xaxis={"title": "layer removed", "dtick": 1}, yaxis={"title": "ΔPPL % (95 % CI)"},
                      yaxis2={"title": "rank (1 = safest)", "overlaying": "y", "side": "right",
                              "range": [len(layers) + 0.5, 0.5]},
                      legend={"orientation": "h", "y": -0.2}, barmode="overlay")
    return _stamp(fig, "Ground truth per layer and each signal's rank", cap or caption(d))


def stability_strip(d: dict, cap: str | None = None):
    """Selection frequency of each layer (columns) for every signal and n (rows: ``signal n=k``); hover: P(same
    set) and the flag."""
    import plotly.graph_objects as go

    rows, z, text = [], [], []
    for name, per_n in d["stability"].items():
        for n, v in per_n.items():
            rows.append(f"{name} n={n}")
            z.append(v["frequency"])
            flag = " (unstable)" if v["unstable"] else ""
            text.append([f"{name}, n={n}, layer {k}: in {f:.0%} of resamples; P(same set) = "
                         f"{v['same_set']:.2f}{flag}" for k, f in enumerate(v["frequency"])])
    fig = go.Figure(go.Heatmap(z=z, x=d["layers"], y=rows, zmin=0, zmax=1, colorscale="Greys", text=text,
                               hovertemplate="%{text}<extra></extra>", colorbar={"title": "frequency"}))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="layer", dtick=1)
    fig.update_layout(height=max(300, 22 * len(rows) + 160))
    return _stamp(fig, "Stability: how often each layer is chosen under a bootstrap of the scoring prompts",
                  cap or caption(d))


def task_truth_bars(d: dict, cap: str | None = None):
    """The task ground truth (``evidence --tasks``): the accuracy lost by removing each block alone (bars, 95 % CI
    over documents; the mean over tasks where several) beside the held-out ΔPPL % (markers, second axis)."""
    import plotly.graph_objects as go

    t, layers = d["task_truth"], d["layers"]
    loss = np.asarray(t["acc_loss"], float)
    ci = np.asarray([[np.nan, np.nan] if c[0] is None else c for c in t["acc_loss_ci"]], float)
    what = "accuracy loss" + (" (mean over tasks)" if len(t["tasks"]) > 1 else f" ({t['tasks'][0]})")
    fig = go.Figure(go.Bar(x=layers, y=loss.tolist(), name=what, marker_color="#4c78a8",
                           error_y={"type": "data", "symmetric": False, "array": (ci[:, 1] - loss).tolist(),
                                    "arrayminus": (loss - ci[:, 0]).tolist()},
                           hovertemplate="layer %{x}: accuracy loss %{y:.4f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=layers, y=d["ground_truth"]["delta_ppl_pct"], yaxis="y2", mode="markers+lines",
                             name="ΔPPL % (held out)", line={"color": "black", "dash": "dot"}))
    ta = t.get("truths_agreement") or {}
    rho = ta.get("spearman")
    lo, hi = (ta.get("spearman_ci") or [None, None])[:2]
    sub = f" (ρ with ΔPPL = {rho:.2f}" + (f" [{lo:.2f}, {hi:.2f}])" if lo is not None else ")") if rho is not None else ""
    fig.update_layout(xaxis={"title": "block removed", "dtick": 1}, yaxis={"title": what + " (95 % CI)"},
                      yaxis2={"title": "ΔPPL %", "overlaying": "y", "side": "right"},
                      legend={"orientation": "h", "y": -0.2})
    return _stamp(fig, "Task ground truth: accuracy lost by removing each block alone" + sub, cap or caption(d))


def evidence_figures(d: dict) -> dict:
    cap = caption(d)
    out = {"agreement": agreement_heatmap(d, cap), "ground_truth": ground_truth_bars(d, cap),
           "stability": stability_strip(d, cap)}
    if d.get("task_truth"):
        out["task_truth"] = task_truth_bars(d, cap)
    return out


def repair_agreement(d: dict, cap: str | None = None):
    """After repair: each signal's Spearman ρ (95 % CI as error bars) against the raw ground truth and against the
    bridged one (:mod:`swapkl.evidence.repair`), signals ordered by ρ against the bridged ground truth."""
    import plotly.graph_objects as go

    from swapkl.evidence.repair import ordered
    from swapkl.evidence.report import repair_caption

    rep = d["repair"]
    names = ordered(rep)
    fig = go.Figure()
    for which, label, color in (("raw", "vs raw ground truth", "#999999"),
                                ("bridged", "vs bridged ground truth", "#1f77b4"),
                                ("bridged_kl", "vs bridged KL", "#ff7f0e")):
        t = rep["agreement"].get(which)
        if not t:
            continue
        y = [t[s]["rho"] for s in names]
        lo = [t[s]["ci"][0] for s in names]
        hi = [t[s]["ci"][1] for s in names]
        up = [None if v is None or h is None else h - v for v, h in zip(y, hi)]
        down = [None if v is None or q is None else v - q for v, q in zip(y, lo)]
        fig.add_trace(go.Scatter(x=names, y=y, mode="markers", name=label, marker={"color": color, "size": 9},
                                 error_y={"type": "data", "symmetric": False, "array": up, "arrayminus": down},
                                 hovertemplate="%{x}: ρ = %{y:.2f}<extra>" + label + "</extra>"))
    fig.update_yaxes(title="Spearman ρ", range=[-1.05, 1.05])
    return _stamp(fig, "After repair: which signal predicts the cost with a bridge (ρ, 95 % CI)",
                  cap or repair_caption(d))
