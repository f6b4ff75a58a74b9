"""The statistics of the protocol gap over checkpoints: per checkpoint (:func:`checkpoint_stats`: the gap
``g = d_repl - d_inter`` in nats by its mean, median, p75 and max over the pairs, the KL ratio, the Pearson
correlation of the two protocols) and per pair against depth (:func:`gap_vs_depth`).  See
:mod:`swapkl.trajectory.compute` for the definitions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np


# Deferred imports: pandas, torch and the torch-based swapkl modules are imported inside the functions that use
# them: the CLI and the dashboard import this module without them.


# ============================================================================================ statistics

@dataclass
class TrajectoryPoint:
    """One checkpoint's scores: ``d_repl``, ``d_inter`` [L, L] float (nats), ``pairs`` [(i, j), i < j]."""

    step: int | None
    d_repl: np.ndarray
    d_inter: np.ndarray
    pairs: list[tuple[int, int]]
    label: str = ""

    def __post_init__(self):
        self.d_repl = np.asarray(self.d_repl, dtype=float)
        self.d_inter = np.asarray(self.d_inter, dtype=float)
        L = self.d_repl.shape[0] if self.d_repl.ndim == 2 else -1
        if self.d_repl.shape != (L, L) or self.d_inter.shape != (L, L):
            raise ValueError(f"d_repl and d_inter must both be L x L, got {self.d_repl.shape} and "
                             f"{self.d_inter.shape}")
        pairs = []
        for p in self.pairs:
            i, j = sorted((int(p[0]), int(p[1])))
            if i == j or i < 0 or j >= L:
                raise ValueError(f"pair {tuple(p)} is not a pair of distinct layers of a {L}-layer model")
            pairs.append((i, j))
        self.pairs = pairs

    @property
    def num_layers(self) -> int:
        return int(self.d_repl.shape[0])

    def values(self) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        """``(d_repl [n], d_inter [n], pairs)`` over the pairs with finite values in both matrices."""
        keep = [(i, j) for i, j in self.pairs
                if np.isfinite(self.d_repl[i, j]) and np.isfinite(self.d_inter[i, j])]
        r = np.array([self.d_repl[i, j] for i, j in keep], dtype=float)
        d = np.array([self.d_inter[i, j] for i, j in keep], dtype=float)
        return r, d, keep


def _is_result(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("replacement", "interchange", "pairs", "num_layers"))


def point_from_result(step, res, label="") -> TrajectoryPoint:
    return TrajectoryPoint(step, res.replacement(), res.interchange(), list(res.pairs), label)


def as_point(item: Any, index: int = 0) -> TrajectoryPoint:
    """Coerce one checkpoint: a :class:`TrajectoryPoint`; ``(step, d_repl, d_inter, pairs)``; ``(step, result)``;
    a result object (``.replacement()``, ``.interchange()``, ``.pairs``, ``.num_layers``; step = ``index``);
    or a dict with ``step``, ``d_repl``, ``d_inter``, ``pairs`` (optional ``label``)."""
    if isinstance(item, TrajectoryPoint):
        return item
    if isinstance(item, dict):
        return TrajectoryPoint(item.get("step"), item["d_repl"], item["d_inter"], item["pairs"],
                               item.get("label", ""))
    if _is_result(item):
        return point_from_result(index, item)
    if isinstance(item, (tuple, list)):
        if len(item) == 4:
            return TrajectoryPoint(item[0], item[1], item[2], item[3])
        if len(item) == 2 and _is_result(item[1]):
            return point_from_result(item[0], item[1])
    raise TypeError(f"cannot read a trajectory checkpoint from {type(item).__name__}")


def as_points(items: Iterable[Any]) -> list[TrajectoryPoint]:
    return [as_point(it, k) for k, it in enumerate(items)]


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def point_stats(point: Any) -> dict:
    """The summary of one checkpoint (see :func:`checkpoint_stats` for the fields)."""
    pt = as_point(point)
    r, d, pairs = pt.values()
    g = r - d
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(r > 0, d / np.where(r > 0, r, 1.0), np.nan)
    n = len(pairs)
    finite_ratio = ratio[np.isfinite(ratio)]

    def agg(fn, a):
        return float(fn(a)) if len(a) else float("nan")

    return {
        "step": pt.step, "label": pt.label, "num_layers": pt.num_layers, "pairs": n,
        "gap_mean": agg(np.mean, g), "gap_median": agg(np.median, g),
        "gap_p75": agg(lambda a: np.percentile(a, 75), g), "gap_max": agg(np.max, g), "gap_min": agg(np.min, g),
        "negative_gaps": int((g < 0).sum()),
        "ratio_mean": agg(np.mean, finite_ratio), "ratio_median": agg(np.median, finite_ratio),
        "pearson": _pearson(r, d),
        "d_repl_mean": agg(np.mean, r), "d_repl_median": agg(np.median, r),
        "d_inter_mean": agg(np.mean, d), "d_inter_median": agg(np.median, d),
    }


def checkpoint_stats(items: Iterable[Any]):
    """pandas DataFrame, one row per checkpoint in the given order, columns:

    ``step`` (Int64, may be <NA>), ``label``, ``num_layers``, ``pairs`` (count used), ``gap_mean``,
    ``gap_median``, ``gap_p75``, ``gap_max``, ``gap_min`` (nats), ``negative_gaps`` (count of g < 0),
    ``ratio_mean``, ``ratio_median`` (d_inter / d_repl), ``pearson`` (r of d_repl vs d_inter over pairs),
    ``d_repl_mean``, ``d_repl_median``, ``d_inter_mean``, ``d_inter_median`` (nats)."""
    import pandas as pd

    df = pd.DataFrame([point_stats(p) for p in as_points(items)])
    if not df.empty:
        df["step"] = df["step"].astype("Int64")
    return df


def pair_frame(items: Iterable[Any]):
    """pandas DataFrame, one row per (checkpoint, pair): ``checkpoint`` (0-based position), ``step``,
    ``label``, ``i``, ``j``, ``depth`` ((i+j)/2/(L-1)), ``d_repl``, ``d_inter``, ``gap`` (nats), ``ratio``."""
    import pandas as pd

    rows = []
    for k, pt in enumerate(as_points(items)):
        r, d, pairs = pt.values()
        L = pt.num_layers
        for (i, j), a, b in zip(pairs, r, d):
            rows.append({"checkpoint": k, "step": pt.step, "label": pt.label, "i": i, "j": j,
                         "depth": (i + j) / 2 / (L - 1), "d_repl": a, "d_inter": b, "gap": a - b,
                         "ratio": b / a if a > 0 else float("nan")})
    df = pd.DataFrame(rows, columns=["checkpoint", "step", "label", "i", "j", "depth", "d_repl", "d_inter", "gap",
                                     "ratio"])
    df["step"] = df["step"].astype("Int64")
    return df


def gap_vs_depth(items: Any, which: int = -1):
    """Per-pair gap against normalised depth for one checkpoint (default: the last of ``items``; a single
    point or result is accepted too).  DataFrame columns ``i``, ``j``, ``depth`` = (i+j)/2/(L-1) in [0, 1],
    ``gap`` (nats), ``d_repl``, ``d_inter``, sorted by depth then i."""
    single_tuple = isinstance(items, tuple) and len(items) == 4 and np.ndim(items[1]) == 2
    if _is_result(items) or isinstance(items, (TrajectoryPoint, dict)) or single_tuple:
        points = [as_point(items)]
    else:
        points = as_points(items)
    if not points:
        raise ValueError("no checkpoints")
    df = pair_frame([points[which]])
    return df[["i", "j", "depth", "gap", "d_repl", "d_inter"]].sort_values(["depth", "i"]).reset_index(drop=True)
