"""The regime verdict (docs/method.md §5): which protocol to trust, from the adjacent pairs' scores."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from swapkl.errors import SwapklError
from swapkl.scoring.results import CONDITIONAL, STRONG  # thresholds in nats (docs/method.md §1)



def as_matrix(d) -> np.ndarray:
    """``d`` as a float64 L x L array (nats); a score matrix that is not square is a one-line error."""
    d = np.asarray(d, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise SwapklError(f"score matrix must be square L×L, got shape {d.shape}")
    return d

def adjacent_pairs(num_layers: int) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(num_layers - 1)]


def _sym(d: np.ndarray, i: int, j: int) -> float:
    v = d[i, j]
    return float(d[j, i]) if np.isnan(v) else float(v)


def regime_verdict(d_repl, d_inter, pairs: Sequence[tuple[int, int]] | None = None,
                   threshold: float = CONDITIONAL) -> dict:
    """The paper's decision rule (docs/method.md §5) on the adjacent pairs (or ``pairs``).

    A protocol is *low* when at least one of the pairs scores below ``threshold`` (0.10 nats, "conditional"),
    *high* otherwise.  high replacement + low interchange → ``"divergent"`` (prefer interchange-guided removal);
    low + low → ``"tied"`` (either protocol; calibrated iterative methods may win at large budgets); high + high →
    ``"weak"`` (swap scores alone are weak).  The unusual low replacement + high interchange is reported as
    ``"divergent"`` with ``prefer="replacement"``.  Returns a JSON-able dict with ``regime``, ``prefer``,
    ``sentence`` and ``evidence`` (per protocol: pairs scored, counts < 0.05 / < 0.10, min, median, best pair; KL
    ratio d_inter/d_repl: median over pairs and best-to-best).
    """
    dr, di = as_matrix(d_repl), as_matrix(d_inter)
    if dr.shape != di.shape:
        raise SwapklError(f"replacement {dr.shape} and interchange {di.shape} matrices differ in shape")
    pairs = list(pairs) if pairs is not None else adjacent_pairs(len(dr))
    ev: dict = {"pairs": "adjacent" if pairs == adjacent_pairs(len(dr)) else [list(p) for p in pairs],
                "threshold": threshold, "strong_threshold": STRONG}
    vals = {}
    for name, d in (("replacement", dr), ("interchange", di)):
        v = np.array([_sym(d, i, j) for i, j in pairs])
        ok = ~np.isnan(v)
        scored = [(p, x) for p, x, o in zip(pairs, v, ok) if o]
        vals[name] = v
        if not scored:
            raise SwapklError(f"no {name} scores on the pairs the verdict needs (adjacent pairs); score them first")
        xs = np.array([x for _, x in scored])
        best_pair, best = min(scored, key=lambda t: t[1])
        ev[name] = {"n_pairs": int(ok.sum()), "below_0.05": int((xs < STRONG).sum()),
                    "below_threshold": int((xs < threshold).sum()), "min": float(xs.min()),
                    "median": float(np.median(xs)), "best_pair": list(best_pair)}
    both = ~np.isnan(vals["replacement"]) & ~np.isnan(vals["interchange"]) & (vals["replacement"] > 0)
    ratio = vals["interchange"][both] / vals["replacement"][both]
    ev["kl_ratio_median"] = float(np.median(ratio)) if ratio.size else None
    ev["kl_ratio_best"] = (ev["interchange"]["min"] / ev["replacement"]["min"]
                           if ev["replacement"]["min"] > 0 else None)
    r_low = ev["replacement"]["below_threshold"] > 0
    i_low = ev["interchange"]["below_threshold"] > 0
    t = f"{threshold:g} nats"
    rmin, imin = ev["replacement"]["min"], ev["interchange"]["min"]
    if not r_low and i_low:
        regime, prefer = "divergent", "interchange"
        sentence = (f"Divergent regime: no adjacent pair is replacement-similar (best d_repl {rmin:.3g}) but "
                    f"{ev['interchange']['below_threshold']} are interchange-similar (best d_inter {imin:.3g}) "
                    f"below {t}; prefer interchange-guided removal.")
    elif r_low and i_low:
        regime, prefer = "tied", "either"
        sentence = (f"Tied regime: both protocols find adjacent pairs below {t} (best d_repl {rmin:.3g}, best "
                    f"d_inter {imin:.3g}); either protocol is fine, calibrated iterative methods may win at large "
                    f"budgets.")
    elif not r_low and not i_low:
        regime, prefer = "weak", "neither"
        sentence = (f"Weak regime: no adjacent pair is below {t} under either protocol (best d_repl {rmin:.3g}, "
                    f"best d_inter {imin:.3g}); swap scores alone are a weak guide, add calibration data or "
                    f"another signal.")
    else:
        regime, prefer = "divergent", "replacement"
        sentence = (f"Divergent regime (unusual direction): adjacent pairs are replacement-similar (best d_repl "
                    f"{rmin:.3g}) but none is interchange-similar (best d_inter {imin:.3g}) below {t}; prefer "
                    f"replacement-guided removal.")
    kr = ev["kl_ratio_best"]
    if regime == "divergent" and prefer == "interchange" and kr is not None and kr > 0.5:
        sentence += f" Borderline: the best-pair KL ratio is {kr:.2f}, not << 1."
    return {"regime": regime, "prefer": prefer, "sentence": sentence, "evidence": ev}
