"""swapkl.stats, the one statistics module, against scipy.stats and plain numpy: the percentile bootstrap equals
scipy's on the same draws, the paired interval is the interval of per-draw differences, ρ is scipy's, the tie rule."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from swapkl import stats


def test_the_percentile_bootstrap_equals_scipys_on_the_same_draws():
    x = np.random.default_rng(3).gamma(2.0, 1.5, size=37)
    ours = stats.percentile_ci(x[stats.bootstrap_indices(len(x), 999, 11)].mean(1))
    theirs = sps.bootstrap((x,), np.mean, n_resamples=999, method="percentile", confidence_level=0.95,
                           rng=np.random.default_rng(11), vectorized=True).confidence_interval
    assert ours == pytest.approx([theirs.low, theirs.high], rel=1e-12)
    assert ours[0] < x.mean() < ours[1]


def test_draws_are_shared_by_seed_so_a_difference_is_paired():
    rng = np.random.default_rng(0)
    base = rng.normal(size=50)
    a, b = base + 0.3 + 0.05 * rng.normal(size=50), base
    idx = stats.bootstrap_indices(50, 500, 2)
    assert (idx == stats.bootstrap_indices(50, 500, 2)).all()
    lo, hi = stats.percentile_ci(a[idx].mean(1) - b[idx].mean(1))
    assert 0.25 < lo < 0.3 < hi < 0.35            # pairing removes the shared noise: a tight interval around 0.3
    ua, ub = stats.percentile_ci(a[idx].mean(1))
    assert hi - lo < (ub - ua) / 5


def test_rank_correlations_and_their_rows_against_scipy():
    rng = np.random.default_rng(5)
    x = rng.normal(size=40)
    y = x + 0.5 * rng.normal(size=40)
    assert stats.spearman(x, y) == pytest.approx(sps.spearmanr(x, y).statistic, abs=0)
    assert stats.kendall(x, y) == pytest.approx(sps.kendalltau(x, y).statistic, abs=0)
    xn = np.append(x, np.nan)
    assert stats.spearman(xn, np.append(y, 1.0)) == stats.spearman(x, y)  # a pair with a NaN is left out
    assert np.isnan(stats.spearman(np.ones(5), np.arange(5.0))) and np.isnan(stats.kendall([1, 2], [2, 1]))
    idx = stats.bootstrap_indices(40, 30, 1)
    rows = stats.spearman_rows(x[idx], y[idx])
    np.testing.assert_allclose(rows, [sps.spearmanr(x[i], y[i]).statistic for i in idx], rtol=1e-12)
    taus = stats.kendall_rows(x[idx], y[idx])
    np.testing.assert_allclose(taus, [sps.kendalltau(x[i], y[i]).statistic for i in idx], rtol=1e-12)
    lo, hi = stats.finite_ci(np.append(rows, np.nan))
    assert lo < stats.spearman(x, y) < hi and lo > 0.5
    assert stats.finite_ci([np.nan, np.inf]) == [None, None]


@pytest.mark.parametrize("ci, tie, side", [([-1.0, 2.0], True, "tie"), ([0.0, 1.0], True, "tie"),
                                           ([0.1, 1.0], False, "worse"), ([-2.0, -0.5], False, "better"),
                                           ([None, None], True, "tie"), (None, True, "tie")])
def test_the_tie_rule(ci, tie, side):
    assert stats.tie(ci) is tie and stats.side(ci) == side


def test_percentile_ci_along_an_axis():
    d = np.arange(200.0).reshape(100, 2)
    out = stats.percentile_ci(d, axis=0)
    assert out.shape == (2, 2) and out[0, 0] == np.percentile(d[:, 0], 2.5) and out[1, 1] == np.percentile(d[:, 1], 97.5)


def test_ppl_and_delta_ppl_draws_against_a_plain_loop():
    rng = np.random.default_rng(1)
    counts = rng.integers(50, 60, size=9).astype(float)
    base = counts * rng.uniform(2.0, 3.0, size=9)
    nll = base * 1.05
    idx = stats.bootstrap_indices(9, 50, 4)
    plain_ppl = [np.exp(sum(nll[i] for i in row) / sum(counts[i] for i in row)) for row in idx]
    plain_delta = [100 * (np.exp((sum(nll[i] for i in row) - sum(base[i] for i in row)) / sum(counts[i] for i in row)) - 1)
                   for row in idx]
    np.testing.assert_allclose(stats.ppl_draws(nll, counts, idx), plain_ppl, rtol=1e-12)
    np.testing.assert_allclose(stats.delta_ppl_draws(nll, base, counts, idx), plain_delta, rtol=1e-10)
    lo, hi = stats.percentile_ci(stats.delta_ppl_draws(nll, base, counts, idx))
    assert not stats.tie([lo, hi]) and lo > 0 and stats.side([lo, hi]) == "worse"
