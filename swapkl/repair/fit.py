"""The streamed least-squares fit of a bridge: normal equations accumulated in float64, solved with a ridge.

A bridge maps rows ``x`` (D features) to targets ``y`` (D features) by ``y ≈ x W``.  Calibration activations arrive
in batches ([n, D] each); :class:`NormalEquations` adds ``XᵀX`` and ``XᵀY`` (and the sums the residual needs) in
float64 (torch, on the activations' device) and forgets the batch, so the memory of a fit is O(D²) whatever the number of calibration tokens.

The solve is ``W = (XᵀX + εI)⁻¹ XᵀY`` with ``ε = ridge · trace(XᵀX) / D`` (``ridge`` is relative to the mean
eigenvalue, so one setting suits every model's activation scale; ``ridge=0`` is plain least squares and a
rank-deficient ``XᵀX`` is refused in one line).  The residual form of docs/method.md ("Linear bridge") fits
``Δ = Y − X`` and returns ``W = I + (XᵀX + εI)⁻¹ XᵀΔ``, which is the same matrix (``XᵀΔ = XᵀY − XᵀX``) up to the ridge
pulling towards the identity instead of towards zero.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swapkl.errors import SwapklError

#: the default relative ridge: ε = DEFAULT_RIDGE · trace(XᵀX) / D
DEFAULT_RIDGE = 1e-4


class FitError(SwapklError):
    """A bridge that cannot be fitted (no calibration rows, a singular system without a ridge)."""


@dataclass
class FitResult:
    """A solved bridge: ``W`` [D, D] float64 (``y ≈ x W``), the absolute ε used, the number of calibration rows,
    and the fit residual: ``residual`` = ‖XW − Y‖²_F / ‖Y − X‖²_F on the calibration rows (1.0: no better than
    the identity, i.e. than removing the span; 0: exact), ``mse`` = ‖XW − Y‖²_F / (rows · D)."""

    W: np.ndarray
    eps: float
    ridge: float
    rows: int
    residual: float
    mse: float
    toward: str

    def summary(self) -> dict:
        return {"eps": self.eps, "ridge": self.ridge, "tokens": self.rows, "residual": self.residual,
                "mse": self.mse, "toward": self.toward}


class NormalEquations:
    """``XᵀX`` (shared) and, per target ``t``, ``XᵀY_t`` and ``tr(Y_tᵀY_t)``, accumulated in float64 over batches.

    Several bridges with the same input ``X`` (spans that start at the same block and end at different blocks)
    share one ``XᵀX``: ``targets`` is how many.  :meth:`add` takes ``x`` and ``y`` (or a list of ``targets`` ys) of
    shape [..., D] (torch tensors or numpy arrays, any float dtype; leading dimensions are flattened into rows)."""

    def __init__(self, dim: int, targets: int = 1):
        self.dim = int(dim)
        self.targets = int(targets)
        self._xtx = None  # torch float64 [D, D] on the activations' device, made at the first add
        self._xty: list = []
        self.yty_trace = [0.0] * targets
        self.rows = 0

    def add(self, x, y) -> None:
        import torch

        ys = y if isinstance(y, (list, tuple)) else [y]
        if len(ys) != self.targets:
            raise FitError(f"{len(ys)} targets given, the fit has {self.targets}")
        x = _rows(x, self.dim)
        if self._xtx is None:
            self._xtx = torch.zeros(self.dim, self.dim, dtype=torch.float64, device=x.device)
            self._xty = [torch.zeros_like(self._xtx) for _ in range(self.targets)]
        for t, yt in enumerate(ys):
            yt = _rows(yt, self.dim).to(x.device)
            if x.shape != yt.shape:
                raise FitError(f"calibration inputs {tuple(x.shape)} and targets {tuple(yt.shape)} differ in shape")
            self._xty[t].addmm_(x.T, yt)
            self.yty_trace[t] += float((yt * yt).sum())
        self._xtx.addmm_(x.T, x)
        self.rows += x.shape[0]

    @property
    def xtx(self) -> np.ndarray:
        return self._xtx.cpu().numpy() if self._xtx is not None else np.zeros((self.dim, self.dim))

    def xty(self, target: int = 0) -> np.ndarray:
        return self._xty[target].cpu().numpy() if self._xty else np.zeros((self.dim, self.dim))

    def nbytes(self) -> int:
        return 8 * self.dim * self.dim * (1 + self.targets)

    def solve(self, ridge: float = DEFAULT_RIDGE, toward: str = "zero", target: int = 0) -> FitResult:
        """The ridge solution for ``target``.  ``toward="zero"``: ``W = (XᵀX+εI)⁻¹XᵀY`` (ReplaceMe's least
        squares); ``toward="identity"``: ``W = I + (XᵀX+εI)⁻¹Xᵀ(Y−X)`` (the residual form).  Equal at ``ridge=0``."""
        if self.rows == 0:
            raise FitError("no calibration rows were added: the bridge has nothing to fit")
        if ridge < 0 or not np.isfinite(ridge):
            raise FitError(f"the ridge must be a finite number >= 0 (got {ridge})")
        if toward not in ("zero", "identity"):
            raise FitError(f"a bridge is pulled toward 'zero' or 'identity', not {toward!r}")
        D = self.dim
        xtx, xty = self.xtx, self.xty(target)
        eps = float(ridge) * float(np.trace(xtx)) / D
        a = xtx + eps * np.eye(D)
        b = xty if toward == "zero" else xty - xtx
        if ridge == 0:
            ev = np.linalg.eigvalsh(xtx)
            if ev[0] <= ev[-1] * D * np.finfo(np.float64).eps:
                rank = int((ev > ev[-1] * D * np.finfo(np.float64).eps).sum())
                raise FitError(f"XᵀX is rank-deficient (rank {rank} of {D}, from {self.rows} calibration rows): "
                               "use a ridge > 0 or more calibration tokens")
        try:
            c = np.linalg.cholesky(a)
            sol = np.linalg.solve(c.T, np.linalg.solve(c, b))
        except np.linalg.LinAlgError:
            raise FitError(f"XᵀX + εI is not positive definite (ε = {eps:.3g}): use a larger ridge") from None
        W = sol if toward == "zero" else np.eye(D) + sol
        return FitResult(W, eps, float(ridge), self.rows, *self._residual(W, xtx, xty, self.yty_trace[target]), toward)

    def _residual(self, W: np.ndarray, xtx: np.ndarray, xty: np.ndarray, yty: float) -> tuple[float, float]:
        """(‖XW−Y‖² / ‖X−Y‖², ‖XW−Y‖² / (rows·D)) from the accumulated sums:
        ‖XW−Y‖² = tr(WᵀXᵀXW) − 2 tr(WᵀXᵀY) + tr(YᵀY)."""
        err = float(np.einsum("ij,ij->", W, xtx @ W) - 2 * np.einsum("ij,ij->", W, xty) + yty)
        base = float(np.trace(xtx) - 2 * np.trace(xty) + yty)
        err = max(err, 0.0)
        return (err / base if base > 0 else 0.0), err / (self.rows * self.dim)


def _rows(a, dim: int):
    """``a`` [..., dim] (a torch tensor or anything numpy reads) as a float64 torch tensor [rows, dim], on the device
    it was on (the sums are made there: a GPU's activations never come back to the CPU)."""
    import torch

    a = a.detach() if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a, dtype=np.float64))
    if a.shape[-1] != dim:
        raise FitError(f"calibration activations have {a.shape[-1]} features, the bridge {dim}")
    return a.reshape(-1, dim).double()
