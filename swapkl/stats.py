"""The one statistics module: every bootstrap, confidence interval, rank correlation and tie swapkl reports.

Conventions, the same everywhere:

* a **bootstrap** resamples units (prompts, evaluation windows, documents) with replacement, ``n_boot`` times, from
  a fixed seed (:func:`bootstrap_indices`); results resampled with the same ``(n_units, n_boot, seed)`` share their
  draws, which makes a comparison of two results on the same units a **paired** bootstrap;
* an interval is the **95 % percentile** interval of the draws (:func:`percentile_ci`: numpy's linear
  interpolation, percentiles 2.5 and 97.5, in the draws' own units);
* a difference whose interval includes zero is a **tie** (:func:`tie`); a verdict names the side the interval lies
  on (:func:`side`);
* rank correlations are :func:`scipy.stats.spearmanr` / :func:`scipy.stats.kendalltau` (τ-b) over the finite
  pairs (:func:`spearman`, :func:`kendall`), vectorised over bootstrap replicates (:func:`spearman_rows`,
  :func:`kendall_rows`) whose interval is :func:`finite_ci`.

Torch-free: numpy, and scipy imported by the functions that use it (importing this module costs no scipy).
"""
from __future__ import annotations

import numpy as np

N_BOOT = 1000
BOOT_SEED = 0


def bootstrap_indices(n_units: int, n_boot: int = N_BOOT, seed: int | np.random.Generator = BOOT_SEED) -> np.ndarray:
    """(n_boot, n_units) int indices, units (windows, prompts, documents) drawn with replacement; fixed seed, so
    every result resampled with the same (n_units, n_boot, seed) uses the same draws (paired bootstrap for ΔPPL).
    ``seed`` may be a ``numpy.random.Generator``: the draw then continues its stream (several draws from one seed)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n_units, size=(n_boot, n_units))


def percentile_ci(draws, axis: int | None = None):
    """The 95 % percentile bootstrap interval of ``draws`` (numpy's linear interpolation, percentiles 2.5 and
    97.5, in the draws' own units): ``[lo, hi]`` as floats, or with ``axis`` an array (2, ...) whose row 0 holds
    the lower and row 1 the upper bounds along the other axes."""
    lo, hi = np.percentile(draws, 2.5, axis=axis), np.percentile(draws, 97.5, axis=axis)
    return [float(lo), float(hi)] if axis is None else np.stack([lo, hi])


def finite_ci(draws) -> list:
    """:func:`percentile_ci` of the finite draws of a 1-d array (a replicate without a value, e.g. a rank
    correlation of constant ranks, is left out); ``[None, None]`` when none is finite."""
    v = np.asarray(draws, dtype=float)
    v = v[np.isfinite(v)]
    return percentile_ci(v) if len(v) else [None, None]


def ppl_draws(nll, counts, idx: np.ndarray) -> np.ndarray:
    """Perplexity per resample, (n_boot,): ``exp(Σ nll / Σ counts)`` over each draw of windows ``idx``
    (:func:`bootstrap_indices`); ``nll`` (W,) summed NLL in nats per window, ``counts`` (W,) scored tokens."""
    return np.exp(np.asarray(nll)[idx].sum(1) / np.asarray(counts)[idx].sum(1))


def delta_ppl_draws(nll, base_nll, counts, idx: np.ndarray) -> np.ndarray:
    """ΔPPL % against a baseline on the same windows, per resample (n_boot,): ``100 (exp((Σ nll − Σ base) / Σ
    counts) − 1)`` over each draw ``idx``; the paired bootstrap of a removal's cost."""
    return 100.0 * (np.exp((np.asarray(nll)[idx].sum(1) - np.asarray(base_nll)[idx].sum(1))
                           / np.asarray(counts)[idx].sum(1)) - 1.0)


def mean_diff_draws(a, b, idx: np.ndarray) -> np.ndarray:
    """Mean of ``b − a`` per resample, (n_boot,): two scores per unit (documents scored by two models, the same
    units in the same order: a paired bootstrap), ``idx`` from :func:`bootstrap_indices`; in the scores' units
    (accuracy: a fraction)."""
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    return d[idx].mean(axis=1)


def mean_diff(a, b, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """``{"delta": mean(b − a), "ci": [lo, hi], "n": units}``: the paired per-unit difference of two score vectors
    of equal length (a document's accuracy before and after removal) with its 95 % percentile bootstrap interval
    (units resampled, :func:`bootstrap_indices`); ``ci`` [None, None] below two units."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two vectors of one length (got {a.shape} and {b.shape})")
    delta = float((b - a).mean()) if a.size else float("nan")
    if a.size < 2:
        return {"delta": delta, "ci": [None, None], "n": int(a.size)}
    lo, hi = percentile_ci(mean_diff_draws(a, b, bootstrap_indices(a.size, n_boot, seed)))
    return {"delta": delta, "ci": [float(lo), float(hi)], "n": int(a.size)}


def tie(ci) -> bool:
    """Whether an interval ``[lo, hi]`` of a difference includes zero (or is unknown: ``lo`` None): a tie."""
    lo, hi = (ci or (None, None))[:2]
    return lo is None or hi is None or lo <= 0.0 <= hi


def side(ci, below: str = "better", above: str = "worse", neither: str = "tie") -> str:
    """The verdict of a difference's interval: ``below`` when it lies below zero, ``above`` when above, else
    ``neither`` (:func:`tie`)."""
    if tie(ci):
        return neither
    return below if ci[1] < 0 else above


def _finite(a, b) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of two vectors where both are finite, as two float arrays."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    m = np.isfinite(a) & np.isfinite(b)
    return a[m], b[m]


def spearman(a, b) -> float:
    """Spearman's ρ (:func:`scipy.stats.spearmanr`) over the pairs where both are finite; NaN below 3 such pairs or
    for constant ranks."""
    from scipy import stats

    x, y = _finite(a, b)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def kendall(a, b) -> float:
    """Kendall's τ-b (:func:`scipy.stats.kendalltau`) over the pairs where both are finite; NaN as :func:`spearman`."""
    from scipy import stats

    x, y = _finite(a, b)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(stats.kendalltau(x, y).statistic)


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman ρ of every row pair of (B, n) arrays (average ranks for ties, as scipy): Pearson of the ranks."""
    from scipy import stats

    ra = stats.rankdata(a, axis=1)
    rb = stats.rankdata(b, axis=1)
    ra = ra - ra.mean(1, keepdims=True)
    rb = rb - rb.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(1) / np.sqrt((ra ** 2).sum(1) * (rb ** 2).sum(1))


def kendall_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Kendall τ-b of every row pair of (B, n) arrays: ``Σ sx·sy / sqrt(Σ|sx| Σ|sy|)`` over pairs i < j."""
    n = a.shape[1]
    iu, ju = np.triu_indices(n, 1)
    sx = np.sign(a[:, iu] - a[:, ju])
    sy = np.sign(b[:, iu] - b[:, ju])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sx * sy).sum(1) / np.sqrt(np.abs(sx).sum(1) * np.abs(sy).sum(1))
