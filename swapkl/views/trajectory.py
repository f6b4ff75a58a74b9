"""Figures of the protocol gap over training (a trajectory), shared by the dashboard and the HTML report."""
from __future__ import annotations

import math

from swapkl.trajectory.compute import trajectory_provenance
from swapkl.views.captions import stamp, contract_caption

# Deferred imports: plotly and pandas are imported by the functions that draw or tabulate.


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
    # a stats table that names the KL ratio columns ratio_*: the figures read kl_ratio_*
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
    """Figures of the protocol gap over training, from :func:`swapkl.trajectory.stats.checkpoint_stats` (one row per
    checkpoint: ``step``, ``gap_mean``/``gap_median``/``gap_p75``/``gap_max`` nats, ``ratio_mean``/``ratio_median``
    or ``kl_ratio_mean``/``kl_ratio_median``, ``pearson``) and :func:`swapkl.trajectory.stats.gap_vs_depth` (``depth`` in
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
    figs["gap"] = stamp(g, "Protocol gap over training (distribution over pairs)", cap)

    r = go.Figure()
    for name, dash in (("kl_ratio_mean", None), ("kl_ratio_median", "dash")):
        if name in stats.columns:
            r.add_trace(go.Scatter(x=x, y=_col(stats, name), mode="lines+markers", name=name.replace("kl_ratio_", ""),
                                   line={"dash": dash}, hovertemplate="%{x}: %{y:.3f}<extra>" + name + "</extra>"))
    r.add_hline(y=1, line={"color": "black", "width": 0.8, "dash": "dot"})
    r.update_layout(xaxis_title=xtitle, yaxis_title="KL ratio d_inter / d_repl", height=420, width=720)
    figs["kl_ratio"] = stamp(r, "KL ratio over training", cap)

    p = go.Figure()
    if "pearson" in stats.columns:
        p.add_trace(go.Scatter(x=x, y=_col(stats, "pearson"), mode="lines+markers", name="pearson",
                               hovertemplate="%{x}: r = %{y:.3f}<extra></extra>"))
    p.update_layout(xaxis_title=xtitle, yaxis_title="Pearson r (d_repl vs d_inter over pairs)",
                    yaxis_range=[-1.05, 1.05], height=420, width=720)
    figs["pearson"] = stamp(p, "Agreement of the two protocols over training", cap)

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
        figs["depth"] = stamp(dfig, "Per-pair gap vs depth at the last checkpoint" + last, cap)
    return figs
