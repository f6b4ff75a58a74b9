"""ReplaceMe (Shopkhoev et al. 2025, arXiv 2505.02819) as a baseline: at budget n, the n consecutive blocks
``ℓ..ℓ+n-1`` whose input and output residual streams are closest in angle (the mean over calibration tokens of
``arccos(cos(x_ℓ, x_{ℓ+n})) / π``, the computation of :mod:`swapkl.removal.methods.angular`), replaced by a
least-squares linear bridge folded into block ℓ−1's MLP output projection.  The sets are those of the angular
distance (not nested); what makes it ReplaceMe is the bridge: with ``--repair bridge`` its curve is evaluated bridged
(``repaired["replaceme"]``) beside its raw curve; without it, only the raw curve (a note says so).  A span that starts
at block 0 has no fold: the run bridges it in the residual form and says so.
"""
from __future__ import annotations

from swapkl.removal.methods.base import MethodOutput
from swapkl.removal.methods.registry import calib_tokens

#: this file's methods, read by the registry without importing the file (swapkl.removal.methods.registry)
METHODS = [
    {"name": "replaceme", "run": "replaceme",
     "description": "ReplaceMe (Shopkhoev et al. 2025): the n consecutive blocks closest in angle, replaced by a "
                    "least-squares linear bridge (bridged with --repair bridge)",
     "label": "ReplaceMe", "rule_candidates": False, "offered": True, "order": 10, "calibration": 2048},
]


def replaceme(ctx, budget):
    from swapkl.errors import SwapklError
    from swapkl.removal.methods.angular import best_blocks, calib_rows, residual_stats

    L = ctx.num_layers
    if budget > L - 1:
        raise SwapklError(f"replaceme: budget {budget} would remove every layer of {L}; at most {L - 1}")
    rows = calib_rows(ctx, calib_tokens(ctx, "replaceme"))
    d = residual_stats(ctx.model, rows)["angular"].mean(0)
    out = MethodOutput(sets=best_blocks(d, budget),
                       info={"angular": d.tolist(), "layer_scores": [float(d[k, k + 1]) for k in range(L)]},
                       settings={"calib_tokens": int(rows.numel()), "window": int(rows.shape[1]),
                                 "block": "n consecutive layers at budget n (not nested)",
                                 "distance": "mean over tokens of arccos(cos(x_l, x_l+n)) / pi",
                                 "bridge": "least squares, folded into block l-1's MLP output projection"})
    if ctx.bridger is None:
        out.notes.append("evaluated without its bridge here; --repair bridge adds the bridged (ReplaceMe) curve")
    return out
