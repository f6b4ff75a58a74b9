"""The one statistics module: every bootstrap, confidence interval, rank correlation and tie swapkl reports.

Conventions, the same everywhere:

* a **bootstrap** resamples units (prompts, evaluation windows, documents) with replacement, ``n_boot`` times, from
  a fixed seed (:func:`bootstrap_indices`); results resampled with the same ``(n_units, n_boot, seed)`` share their
  draws, which makes a comparison of two results on the same units a **paired** bootstrap;
* an interval is the **95 % percentile** interval of the draws (:func:`percentile_ci`: numpy's linear
  interpolation, percentiles 2.5 and 97.5, in the draws' own units);
* a difference whose interval includes zero is a **tie** (:func:`tie`); a verdict names the side the interval lies
  on (:func:`side`);
* rank correlations are :func:`scipy.stats.spearmanr` / :func:`scipy.stats.kendalltau` (τ-b), with a bootstrap
  interval over the units (:func:`spearman_ci`).

Torch-free: numpy and scipy only.
"""
from __future__ import annotations

from typing import Callable

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


def bootstrap_ci(values, statistic: Callable = np.mean, n_boot: int = N_BOOT,
                 seed: int | np.random.Generator = BOOT_SEED, idx: np.ndarray | None = None) -> list[float]:
    """The percentile interval of ``statistic`` over units resampled with replacement: ``values`` (n_units, ...)
    per unit; ``statistic(resampled, axis=1)`` reduces the (n_boot, n_units, ...) draws; ``idx``: the draws to use
    (:func:`bootstrap_indices`; given, a paired comparison shares them)."""
    v = np.asarray(values, dtype=float)
    idx = bootstrap_indices(len(v), n_boot, seed) if idx is None else idx
    return percentile_ci(statistic(v[idx], axis=1))


def paired_ci(a, b, statistic: Callable = np.mean, n_boot: int = N_BOOT,
              seed: int | np.random.Generator = BOOT_SEED) -> list[float]:
    """The paired-bootstrap interval of ``statistic(a) - statistic(b)`` over shared units (``a`` and ``b``: one
    value per unit, the same units in the same order)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"a paired comparison needs the same units on both sides ({a.shape[0]} != {b.shape[0]})")
    idx = bootstrap_indices(len(a), n_boot, seed)
    return percentile_ci(statistic(a[idx], axis=1) - statistic(b[idx], axis=1))


def ppl_draws(nll, counts, idx: np.ndarray) -> np.ndarray:
    """Perplexity per resample, (n_boot,): ``exp(Σ nll / Σ counts)`` over each draw of windows ``idx``
    (:func:`bootstrap_indices`); ``nll`` (W,) summed NLL in nats per window, ``counts`` (W,) scored tokens."""
    return np.exp(np.asarray(nll)[idx].sum(1) / np.asarray(counts)[idx].sum(1))


def delta_ppl_draws(nll, base_nll, counts, idx: np.ndarray) -> np.ndarray:
    """ΔPPL % against a baseline on the same windows, per resample (n_boot,): ``100 (exp((Σ nll − Σ base) / Σ
    counts) − 1)`` over each draw ``idx``; the paired bootstrap of a removal's cost."""
    return 100.0 * (np.exp((np.asarray(nll)[idx].sum(1) - np.asarray(base_nll)[idx].sum(1))
                           / np.asarray(counts)[idx].sum(1)) - 1.0)


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


def spearman(x, y) -> float:
    """Spearman's ρ of two vectors (:func:`scipy.stats.spearmanr`)."""
    from scipy import stats

    return float(stats.spearmanr(np.asarray(x, dtype=float), np.asarray(y, dtype=float)).statistic)


def kendall(x, y) -> float:
    """Kendall's τ-b of two vectors (:func:`scipy.stats.kendalltau`)."""
    from scipy import stats

    return float(stats.kendalltau(np.asarray(x, dtype=float), np.asarray(y, dtype=float)).statistic)


def spearman_ci(x, y, n_boot: int = N_BOOT, seed: int | np.random.Generator = BOOT_SEED) -> tuple[float, list]:
    """``(ρ, [lo, hi])``: Spearman's ρ of paired vectors and its percentile interval over the pairs resampled with
    replacement (constant ranks have no ρ: NaN, and such a draw is left out; no finite draw: ``[None, None]``)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)

    def rho(a, b) -> float:
        return spearman(a, b) if np.ptp(a) > 0 and np.ptp(b) > 0 else float("nan")

    draws = np.array([rho(x[i], y[i]) for i in bootstrap_indices(len(x), n_boot, seed)])
    draws = draws[np.isfinite(draws)]
    return rho(x, y), (percentile_ci(draws) if draws.size else [None, None])
