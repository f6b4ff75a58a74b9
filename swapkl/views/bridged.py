"""The third matrix beside the two protocols: replacement, interchange and bridged swap-KL (block span i..j−1
replaced by its linear bridge) on ONE colour scale, the statement of which pair each ranks best and which
protocol's choice the bridge favours, and one pair's bridged and unbridged span cost (plotly; no Streamlit).

``bridged`` is the dict of a :class:`~swapkl.repair.bridged_kl.BridgedResult` (``to_dict()``: ``spans`` a list of
``{"span": [i, j], "bridged": [P], "raw": [P], ...}`` per-prompt KL in nats, ``settings`` the bridge settings).
Only spans ``[i, j)`` with ``j < L`` are pairs; the spans that run to the last block are not drawn here.
"""
from __future__ import annotations

import numpy as np

from swapkl.errors import SwapklError
from swapkl.scoring.verdict import regime_verdict
from swapkl.scoring.results import matrix_json
from swapkl.views.captions import stamp, contract_caption, fmt_number
from swapkl.views.scores import layer_axes

TIE_NATS = 1e-9  # two bridged means closer than this favour neither pair


def span_means(bridged: dict, which: str = "bridged") -> dict:
    """``{(i, j): mean KL over prompts}`` (nats) of every span in the dict (``which``: "bridged" or "raw")."""
    return {(int(s["span"][0]), int(s["span"][1])): float(np.mean(s[which])) for s in bridged.get("spans", [])}


def bridged_matrix(bridged: dict, num_layers: int, which: str = "bridged") -> np.ndarray:
    """[L, L] mean KL of span ``[i, j)`` at ``[i, j]`` for ``j < L`` (NaN where not computed), nats."""
    m = np.full((num_layers, num_layers), np.nan)
    for (i, j), v in span_means(bridged, which).items():
        if j < num_layers:
            m[i, j] = v
    return m


def shared_scale(*matrices) -> tuple[float, float]:
    """(zmin, zmax) over the finite cells of all matrices (one colour scale; (0, 1) when none is finite)."""
    vals = np.concatenate([np.asarray(m, float)[np.isfinite(m)] for m in matrices])
    if not vals.size:
        return 0.0, 1.0
    lo, hi = float(vals.min()), float(vals.max())
    return lo, (hi if hi > lo else lo + 1e-9)


def _best(means: dict, pairs) -> tuple | None:
    cand = [(means[p], p) for p in pairs if p in means and np.isfinite(means[p])]
    return min(cand)[1] if cand else None


def best_pairs(result, bridged: dict) -> dict:
    """The lowest-KL pair of the result's pair set under each of replacement, interchange and bridged
    (``{"replacement": (i, j) or None, ...}``; ties go to the earlier pair in (value, i, j) order)."""
    repl, inter = result.replacement(), result.interchange()
    pairs = [tuple(p) for p in result.pairs]
    return {"replacement": _best({p: float(repl[p]) for p in pairs}, pairs),
            "interchange": _best({p: float(inter[p]) for p in pairs}, pairs),
            "bridged": _best(span_means(bridged), pairs)}


def bridge_favours(result, bridged: dict) -> str:
    """Which protocol's best pair the bridge favours: "replacement", "interchange" (its best pair has the lower
    bridged KL), "same" (both protocols rank the same pair best) or "neither" (a tie, or a bridged value missing)."""
    best, means = best_pairs(result, bridged), span_means(bridged)
    r, x = best["replacement"], best["interchange"]
    if r is None or x is None:
        return "neither"
    if r == x:
        return "same"
    if r not in means or x not in means or abs(means[r] - means[x]) <= TIE_NATS:
        return "neither"
    return "replacement" if means[r] < means[x] else "interchange"


def bridge_statement(result, bridged: dict) -> str:
    """One line: the best pair under each matrix (its KL in nats) and which protocol's best pair the bridge favours."""
    best, means = best_pairs(result, bridged), span_means(bridged)
    vals = result.protocol_scores()

    def part(name):
        p = best[name]
        if p is None:
            return f"{name} –"
        v = means[p] if name == "bridged" else float(vals[name][p])
        return f"{name} ({p[0]}, {p[1]}) {fmt_number(v)} nats"

    head = "Best pair: " + " · ".join(part(n) for n in ("replacement", "interchange", "bridged")) + ". "
    fav = bridge_favours(result, bridged)
    r, x = best["replacement"], best["interchange"]
    if fav == "same":
        line = f"Both protocols rank ({r[0]}, {r[1]}) best: the bridge cannot change which protocol to prefer."
    elif fav == "neither":
        line = "The bridge favours neither protocol's best pair (a tie or a pair without a bridged value)."
    else:
        line = (f"The bridge favours the {fav}-best pair (bridged KL {fmt_number(means[r])} nats at ({r[0]}, {r[1]}) "
                f"vs {fmt_number(means[x])} at ({x[0]}, {x[1]})).")
    return head + line + verdict_change(result, fav)


def verdict_change(result, fav: str) -> str:
    """Whether the regime verdict's preferred protocol (:func:`~swapkl.scoring.verdict.regime_verdict` on the
    adjacent pairs) still holds after the bridge (``fav`` from :func:`bridge_favours`); "" without a verdict."""
    try:
        prefer = regime_verdict(result.replacement(), result.interchange())["prefer"]
    except SwapklError:  # the adjacent pairs are not all scored
        return ""
    if prefer not in ("replacement", "interchange"):
        return f" The verdict prefers {prefer} protocol, so there is no single choice for the bridge to change."
    if fav == prefer:
        return f" The verdict's choice (prefer {prefer}) holds after the bridge."
    if fav in ("replacement", "interchange"):
        return f" After the bridge the verdict's choice (prefer {prefer}) changes to {fav}."
    return f" The bridge does not change the verdict's choice (prefer {prefer})."


def bridge_caption(bridged: dict) -> str:
    """The bridge's settings in words, e.g. ``bridge: folded, 4096 calibration tokens (window 128, seed 0), ridge
    0.001``."""
    s = bridged.get("settings", {})
    return (f"bridge: {s.get('form', '?')}, {s.get('calib_tokens', '?')} calibration tokens (window "
            f"{s.get('calib_window', '?')}, seed {s.get('calib_seed', '?')}), ridge {s.get('ridge', '?')}")


def span_costs(bridged: dict, i: int, j: int) -> tuple[float, float] | None:
    """(bridged, unbridged) mean KL of span ``[i, j)`` in nats, or None when the span was not computed."""
    b, r = span_means(bridged).get((i, j)), span_means(bridged, "raw").get((i, j))
    return None if b is None else (b, r)


def bridged_heatmaps(result, bridged: dict, colorscale: str = "Viridis", caption: str | None = None):
    """Replacement ``d_repl``, interchange ``d_inter`` and bridged KL [L, L] side by side on one colour axis whose
    ``cmin``/``cmax`` span the finite cells of all three (nats; NaN = not computed = blank)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    L = result.num_layers
    mats = {"replacement d_repl": result.replacement(), "interchange d_inter": result.interchange(),
            "bridged (block span i..j−1 replaced by its bridge)": bridged_matrix(bridged, L)}
    zmin, zmax = shared_scale(*mats.values())
    fig = make_subplots(rows=1, cols=3, subplot_titles=tuple(mats), horizontal_spacing=0.06)
    axis = list(range(L))
    for col, (name, m) in enumerate(mats.items(), start=1):
        short = name.split(" ")[0]
        fig.add_trace(go.Heatmap(z=matrix_json(m), x=axis, y=axis, coloraxis="coloraxis", name=short, xgap=1,
                                 ygap=1, hovertemplate="i %{y} · j %{x}: %{z:.4g} nats<extra>" + short + "</extra>"),
                      row=1, col=col)
        layer_axes(fig, L, row=1, col=col)
    fig.update_layout(coloraxis={"colorscale": colorscale, "cmin": zmin, "cmax": zmax,
                                 "colorbar": {"title": {"text": "nats"}}},
                      height=440, width=1280, plot_bgcolor="white")
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False)
    cap = caption or f"{contract_caption(result)} · {bridge_caption(bridged)}"
    return stamp(fig, "Swap-KL by protocol and after the bridge (lower = more redundant)", cap, extra_top=18)
