"""Removal curves of attention / MLP sublayer units: the check that a run's methods apply to its unit, and the key
that keeps their evaluations apart from block removals in the shared memo.

A sublayer curve removes (skips, :mod:`swapkl.surgery.skip`) the attention or the MLP sublayer of each chosen layer.
The guided methods select with the same code as for blocks, on the unit's swap-KL matrices (a score result whose
contract unit is that unit); random draws layers; BI scores each sublayer by ``1 - cos(stream before, stream after)``
around it; SLEB greedily skips the sublayer whose removal hurts calibration perplexity least; the recommendation runs
its beam search over the unit's sublayers, seeded by the unit methods only.  Which methods apply to which unit is
the registry's data (each method's ``units``, :func:`swapkl.removal.methods.for_unit`); the others (CKA, angular
distance, Taylor, LaCo merging, the mix) are defined on whole blocks and are refused."""
from __future__ import annotations

from swapkl.contract import BLOCK, check_unit
from swapkl.removal import methods as M


def unit_key_suffix(unit: str) -> str:
    """What a unit adds to a memo text key: nothing for blocks (a block key names no unit), ``|unit:<unit>`` for a
    sublayer, so its evaluations never meet a block removal's of the same layer indices."""
    return "" if unit == BLOCK else f"|unit:{unit}"


def check_unit_run(model, unit: str, specs) -> str:
    """``unit`` when ``model`` has it and every method of ``specs`` applies to it; else a one-line error
    (:class:`~swapkl.errors.ContractError`, or :class:`~swapkl.model.units.UnsupportedUnit` naming the family)."""
    if check_unit(unit) == BLOCK:
        return unit
    M.refuse_other_units([s.name for s in specs], unit)
    from swapkl.model import architectures as arch  # deferred: pulls torch
    from swapkl.model.units import layout_for

    layout_for(model, arch.locate(model))
    return unit
