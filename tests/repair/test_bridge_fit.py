"""The streamed normal equations of swapkl.repair.fit against numpy's least squares and a plain ridge solve."""
import numpy as np
import pytest
import torch

from swapkl.repair.fit import FitError, NormalEquations


def _data(n=300, d=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 3.0, size=d)
    y = x @ rng.normal(size=(d, d)) + 0.3 * rng.normal(size=(n, d))
    return x, y


def _streamed(x, y, sizes=(7, 50, 1, 100)):
    ne = NormalEquations(x.shape[1])
    k, s = 0, 0
    while k < len(x):  # uneven batches, some as torch float32 tensors
        m = sizes[s % len(sizes)]
        xb, yb = x[k:k + m], y[k:k + m]
        if s % 2:
            ne.add(torch.from_numpy(xb), torch.from_numpy(yb))
        else:
            ne.add(xb[None], yb[None])  # leading dimensions are flattened
        k, s = k + m, s + 1
    return ne


def test_streamed_fit_equals_lstsq():
    x, y = _data()
    fit = _streamed(x, y).solve(ridge=0.0)
    want = np.linalg.lstsq(x, y, rcond=None)[0]
    np.testing.assert_allclose(fit.W, want, rtol=1e-8, atol=1e-10)
    assert fit.rows == len(x) and fit.eps == 0.0
    err = ((x @ want - y) ** 2).sum()
    assert fit.residual == pytest.approx(err / ((x - y) ** 2).sum(), rel=1e-8)
    assert fit.mse == pytest.approx(err / y.size, rel=1e-8)
    # the residual form without a ridge is the same matrix
    np.testing.assert_allclose(_streamed(x, y).solve(ridge=0.0, toward="identity").W, want, rtol=1e-7, atol=1e-9)


def test_streamed_ridge_equals_plain_ridge():
    x, y = _data(seed=1)
    d = x.shape[1]
    ridge = 0.05
    eps = ridge * np.trace(x.T @ x) / d
    zero = _streamed(x, y).solve(ridge=ridge)
    np.testing.assert_allclose(zero.W, np.linalg.solve(x.T @ x + eps * np.eye(d), x.T @ y), rtol=1e-9, atol=1e-12)
    ident = _streamed(x, y).solve(ridge=ridge, toward="identity")
    want = np.eye(d) + np.linalg.solve(x.T @ x + eps * np.eye(d), x.T @ (y - x))
    np.testing.assert_allclose(ident.W, want, rtol=1e-9, atol=1e-12)
    assert zero.eps == pytest.approx(eps) and ident.eps == pytest.approx(eps)
    assert not np.allclose(zero.W, ident.W)  # the ridge pulls towards different matrices


def test_rank_deficient_without_ridge_is_one_clear_line():
    x, y = _data(n=5, d=12)  # 5 rows cannot determine 12 features
    with pytest.raises(FitError, match=r"rank-deficient \(rank 5 of 12.*use a ridge > 0") as e:
        _streamed(x, y).solve(ridge=0.0)
    assert "\n" not in str(e.value)
    assert np.isfinite(_streamed(x, y).solve(ridge=1e-3).W).all()  # a ridge makes it solvable


def test_bad_inputs():
    ne = NormalEquations(4)
    with pytest.raises(FitError, match="no calibration rows"):
        ne.solve()
    with pytest.raises(FitError, match="features"):
        ne.add(np.zeros((3, 5)), np.zeros((3, 5)))
    with pytest.raises(FitError, match="differ in shape"):
        ne.add(np.zeros((3, 4)), np.zeros((2, 4)))


def test_targets_share_one_gram():
    x, y = _data(seed=2)
    y2 = np.tanh(y)
    ne = NormalEquations(x.shape[1], targets=2)
    ne.add(x[:100], [y[:100], y2[:100]])
    ne.add(torch.from_numpy(x[100:]), [y[100:], torch.from_numpy(y2[100:])])
    for t, yt in enumerate((y, y2)):
        np.testing.assert_allclose(ne.solve(0.0, target=t).W, np.linalg.lstsq(x, yt, rcond=None)[0], rtol=1e-8,
                                   atol=1e-10)


def test_fit_streams_batches_and_its_state_does_not_grow(monkeypatch):
    """The fit never sees more than one batch of activations at once, and what it keeps is O(d²) whatever the
    number of calibration tokens (experiments/bridge_fit.py measures the resident memory on the default model)."""
    from conftest import tiny_model
    from swapkl.repair import fit as F
    from swapkl.repair.calibration import CalibrationText, fit_bridges

    seen, kept = [], []
    real_add = F.NormalEquations.add

    def add(self, x, y):
        seen.append(x.shape[0] * x.shape[1])
        real_add(self, x, y)
        kept.append(sum(t.numel() for t in [self._xtx, *self._xty]))

    monkeypatch.setattr(F.NormalEquations, "add", add)
    model = tiny_model("llama")
    for windows in (4, 16):
        ids = torch.randint(1, 96, (windows, 16), generator=torch.Generator().manual_seed(windows))
        fit_bridges(model, CalibrationText(ids, [], {}), [(1, 3)], "folded", batch_rows=2)
        assert max(seen) == 2 * 16 and len(seen) == windows // 2
        assert set(kept) == {2 * 32 * 32}
        seen.clear()
        kept.clear()
