"""A seeded method's curves (one per seed) as the one curve a result shows (:func:`aggregate_seeds`)."""
from __future__ import annotations

import numpy as np


def aggregate_seeds(per_seed: dict) -> list[dict]:
    """One curve from a seeded method's curves ``{seed: [entry at n = 1, 2, ...]}``: at each n, the mean PPL, ΔPPL (%)
    and KL over the seeds that reached it, their spread (min, max, sample std of ΔPPL) and each seed's set."""
    out = []
    n_max = max(len(v) for v in per_seed.values())
    for k in range(n_max):
        rows = [v[k] for v in per_seed.values() if len(v) > k]
        d = np.array([r["delta_pct"] for r in rows])
        p = np.array([r["ppl"] for r in rows])
        kls = [r["kl_to_base"] for r in rows if r["kl_to_base"] is not None]
        out.append({"n": k + 1, "removed": None, "ppl": float(p.mean()), "ppl_min": float(p.min()),
                    "ppl_max": float(p.max()), "ppl_ci": None, "delta_pct": float(d.mean()),
                    "delta_pct_min": float(d.min()), "delta_pct_max": float(d.max()),
                    "delta_pct_std": float(d.std(ddof=1)) if len(d) > 1 else 0.0, "delta_pct_ci": None,
                    "kl_to_base": float(np.mean(kls)) if kls else None, "n_seeds": len(rows),
                    "per_seed": [{"seed": int(s), "removed": v[k]["removed"], "ppl": v[k]["ppl"],
                                  "delta_pct": v[k]["delta_pct"]} for s, v in per_seed.items() if len(v) > k]})
    return out
