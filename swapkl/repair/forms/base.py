"""What a bridge form is: :class:`BridgeForm`, the interface each form implements in its own file of this package
(docs/repair.md "Forms").  A form owns everything that differs between the ways a d×d map ``W`` can stand in for a
removed span ``[i, j)`` of blocks: where it applies (:meth:`BridgeForm.check`), what its least-squares fit regresses
(:meth:`BridgeForm.fit_rows`, :attr:`BridgeForm.toward`), the stream where block ``j`` starts in the bridged model
(:meth:`BridgeForm.start_state`), how it attaches to a pruned model as a constant map (:meth:`BridgeForm.attach`) or a
trainable one (:meth:`BridgeForm.attach_map`, :meth:`BridgeForm.merge`), and whether it exports as an ordinary
checkpoint (:meth:`BridgeForm.export_refusal`).

No torch at import: the registry is read by the plan and the dashboard before torch is loaded; the methods import
what they compute with.
"""
from __future__ import annotations

from swapkl.errors import SwapklError


class NoExactFold(SwapklError):
    """The folded form does not apply to this span of this family (the residual form does)."""


class BridgeForm:
    """One form of a linear bridge.  ``name``: its ``--form`` spelling; ``order``: its place in choices (lowest
    first: the default); ``description``: one line for the choices table; ``exports``: whether a model bridged in
    this form saves as an ordinary checkpoint of its family; ``fallback``: the form a span uses where this one does
    not apply (None: it always applies); ``toward``: what the ridge pulls ``W`` toward (``"identity"`` or
    ``"zero"``, :meth:`swapkl.repair.fit.NormalEquations.solve`)."""

    name: str = ""
    order: int = 100
    description: str = ""
    exports: bool = False
    fallback: str | None = None
    toward: str = "zero"

    def check(self, model, start: int) -> None:
        """Raise :class:`NoExactFold` (one line) when this form cannot bridge a span starting at block ``start`` of
        ``model``; the default applies everywhere."""

    def check_start(self, start: int) -> None:
        """The part of :meth:`check` that needs no model: raise :class:`NoExactFold` for a span starting at block
        ``start`` whatever the family; the default applies everywhere."""

    def captures(self, start: int) -> set[int]:
        """The blocks whose MLP output (output projection's output) the fit and :meth:`start_state` of a span
        starting at ``start`` read; none by default."""
        return set()

    def fit_rows(self, got: dict, i: int, ends) -> tuple:
        """``(X, [Y per end])`` float64 rows [B, T, D] of span ``[i, j)`` for each ``j`` of ``ends``, from the
        recorded activations ``got`` (``("h", s)``: the stream entering block s; ``("m", k)``: block k's MLP output)."""
        raise NotImplementedError

    def start_state(self, h, W, m=None):
        """The bridged stream where the block after the span starts, from ``h`` [.., D] (the stream entering block
        ``i``, model dtype), ``W`` [D, D] float32 on ``h``'s device and ``m`` (block ``i − 1``'s MLP output where
        :meth:`captures` asks for it); float32 arithmetic, returned in ``h``'s dtype."""
        raise NotImplementedError

    def site(self, loc, bridge, new_index, num_layers: int):
        """The module of the pruned model (located as ``loc``) where ``bridge`` acts; ``new_index(old)``: a source
        block's index in the pruned model; ``num_layers``: the source model's block count."""
        raise NotImplementedError

    def attach(self, site, bridge, loc) -> None:
        """Put ``bridge``'s constant map (``bridge.W``, float64) on ``site`` of the pruned model ``loc``."""
        raise NotImplementedError

    def attach_map(self, site, bridge_map) -> None:
        """Hook a trainable ``h ↦ h W`` module (:class:`swapkl.healing.bridged.BridgeMap`) onto ``site``."""
        raise NotImplementedError

    def merge(self, site, bridge, loc) -> None:
        """After training: make ``bridge`` (its trained ``W``) part of the merged model's weights where the form
        allows (default: it stays hooked)."""

    def params_added(self, dim: int) -> int:
        """Parameters the bridged model holds beyond the kept blocks (0 when the map folds into a weight)."""
        return dim * dim

    def export_refusal(self, bridge) -> str | None:
        """One line saying why a model with ``bridge`` is no ordinary checkpoint, or None when it exports."""
        return None
