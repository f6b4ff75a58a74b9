"""Units of analysis: a whole block, or its attention or MLP sublayer, as data.

A sublayer unit is the sublayer's module **together with the norms that belong to it** (docs/method.md §1,
"Sublayer units"), so that the two units of a block partition its parameters: exchanging both units of blocks i
and j is exactly exchanging the blocks, and copying both is exactly the block replacement.  Each family names a
:class:`UnitLayout` (a row of :data:`LAYOUTS`) in its ``units`` field; a family found by the generic fallback gets
the first layout that :func:`validate_layout` accepts on the loaded model, else the layout found on the model by
:mod:`swapkl.model.unit_discovery` (validated the same way), or none (sublayers are then refused with a one-line
message naming the family).

What a layout says, for each sublayer unit:

* ``modules``: the block's child modules that make up the unit (norms included; dotted paths relative to the
  block), whose parameters and buffers are the unit's weights;
* ``out``: the output projection(s) whose weight and bias set to zero silence the sublayer's residual branch.
  For these residual sublayers (``h + f(norm(h))``, a post-norm of ``f`` included: a norm of zeros is zero) that
  is exactly skipping the unit;
* ``core``: the module whose output *is* the residual branch (before any post-norm), the one a skipping runtime
  replaces (:mod:`swapkl.surgery` does that).

Nothing here dispatches on ``model_type``: the family table says which layout a family has.
"""
from __future__ import annotations

import weakref

import torch

from swapkl.contract import BLOCK, SUBLAYERS, UNITS, check_unit  # noqa: F401  (the unit names, defined once there)
from swapkl.errors import SwapklError
from swapkl.model.layouts import LAYOUTS, SublayerSpec, UnitLayout, _get, representatives, zero_out  # noqa: F401  (re-exported)
from swapkl.model.block_io import hidden_of


class UnsupportedUnit(SwapklError):
    """A sublayer unit asked of a family whose sublayers are not defined or could not be validated."""


def unit_keys(block: torch.nn.Module, layout: UnitLayout, unit: str) -> frozenset[str]:
    """The names of ``block``'s state-dict entries (parameters and persistent buffers, as
    ``block.state_dict()`` names them) that belong to ``unit``; every entry for ``"block"``."""
    keys = block.state_dict(keep_vars=True).keys()
    if check_unit(unit) == BLOCK:
        return frozenset(keys)
    prefixes = tuple(m + "." for m in layout.spec(unit).modules)
    return frozenset(k for k in keys if k.startswith(prefixes))


def mixed_weights(own: dict, other: dict, keys: frozenset[str]) -> dict:
    """A block's weights with the entries in ``keys`` taken from ``other`` (another block's state dict) and the
    rest from ``own``: the weights slot i runs in ``M[i<-j]`` for a sublayer unit."""
    return {k: (other[k] if k in keys else v) for k, v in own.items()}


def partition_error(block: torch.nn.Module, layout: UnitLayout) -> str | None:
    """None when the layout's two units name existing modules whose weights partition ``block``'s state dict
    (every entry in exactly one unit), else why not."""
    for unit in SUBLAYERS:
        spec = layout.spec(unit)
        for path in (*spec.modules, spec.core):
            if not isinstance(_get(block, path), torch.nn.Module):
                return f"its blocks have no '{path}'"
        if not any(isinstance(_get(block, path), (torch.nn.Module, torch.Tensor)) for path in spec.out):
            return f"its blocks have none of '{', '.join(spec.out)}'"
    att, mlp = (unit_keys(block, layout, u) for u in SUBLAYERS)
    everything = set(block.state_dict(keep_vars=True).keys())
    if att & mlp:
        return f"the attention and MLP units share weights ({sorted(att & mlp)[0]})"
    if att | mlp != everything:
        return f"weights outside both units ({sorted(everything - (att | mlp))[0]})"
    return None


_VALIDATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def validate_layout(model: torch.nn.Module, blocks: torch.nn.ModuleList, layout: UnitLayout) -> str | None:
    """None if ``layout`` describes ``model``'s sublayers, else why not.  Checked on the loaded model: the two
    units partition every block's weights (so swapping both units is swapping the block), and with both output
    projections of one block of each structure zeroed the block is the identity on a random input (so each unit is a
    residual branch and zeroing its projection skips it; a post-norm block fails here)."""
    import copy

    for b in blocks:
        why = partition_error(b, layout)
        if why is not None:
            return why
    for k in representatives(blocks):
        probe = copy.deepcopy(blocks[k]).eval()
        for unit in SUBLAYERS:
            zero_out(probe, layout, unit)
        p = next(probe.parameters())
        hidden = int(getattr(model.config, "hidden_size", 0) or getattr(model.config, "n_embd", 0) or p.shape[-1])
        h = torch.randn(1, 5, hidden, generator=torch.Generator().manual_seed(0)).to(p.device, p.dtype)
        try:
            from swapkl.model.architectures import block_call_args

            args, kwargs = block_call_args(model, 5)
            with torch.inference_mode():
                out = probe(h, *args, **kwargs)
        except Exception as e:  # any failure means "cannot validate"
            return f"a block could not be run alone ({type(e).__name__})"
        out = hidden_of(out)
        tol = 1e-5 if p.dtype == torch.float32 else 1e-2
        if (out.float() - h.float()).abs().max() > tol * h.float().abs().max():
            return "a block with both output projections zeroed is not the identity (post-norm or a non-residual branch)"
    return None


def adopt_layout(model: torch.nn.Module, layout: UnitLayout | None) -> None:
    """Make ``layout`` (validated on ``model`` by the caller: a user's family, :mod:`swapkl.model.user_family`) the
    one :func:`layout_for` returns for that model object; None forgets any layout found for it before."""
    if layout is None:
        _VALIDATED.pop(model, None)
    else:
        _VALIDATED[model] = layout


def layout_for(model: torch.nn.Module, loc) -> UnitLayout:
    """The sublayer layout of a located model (``loc``: :class:`~swapkl.model.architectures.Located`): the
    family's named layout, else (generic fallback) the first of :data:`LAYOUTS` that validates on the model.
    Raises :class:`UnsupportedUnit` with a one-line message naming the family.  Memoised per model object."""
    if model in _VALIDATED:
        return _VALIDATED[model]
    fam = loc.family
    reasons = []
    candidates = [LAYOUTS[fam.units]] if fam.units else ([] if not fam.generic else list(LAYOUTS.values()))
    for layout in candidates:
        why = validate_layout(model, loc.blocks, layout)
        if why is None:
            _VALIDATED[model] = layout
            return layout
        reasons.append(f"{layout.name}: {why}")
    if fam.generic:
        from swapkl.model.unit_discovery import find_layout

        found = find_layout(model, loc.blocks)
        why = found if isinstance(found, str) else validate_layout(model, loc.blocks, found)
        if why is None:
            from swapkl.model.unit_discovery import skip_error

            why = skip_error(model, loc.blocks, found)
        if why is None:
            _VALIDATED[model] = found
            return found
        reasons.insert(0, f"found on the model: {why}")
    detail = "; ".join(reasons) if reasons else "no sublayer layout is defined for it"
    raise UnsupportedUnit(f"attention/MLP units are not available for the '{fam.name}' family ({detail[:240]}); "
                          "use --unit block")
