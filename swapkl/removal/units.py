"""Removal curves of attention / MLP sublayer units: which methods apply per unit, and the key that keeps their
evaluations apart from block removals in the shared memo.

A sublayer curve removes (skips, :mod:`swapkl.surgery.skip`) the attention or the MLP sublayer of each chosen layer.
The guided methods select with the same code as for blocks, on the unit's swap-KL matrices (a score result whose
contract unit is that unit); random draws layers; BI scores each sublayer by ``1 - cos(stream before, stream after)``
around it; SLEB greedily skips the sublayer whose removal hurts calibration perplexity least; the recommendation runs
its beam search over the unit's sublayers, seeded by the unit methods only.  Other methods (CKA, angular distance,
Taylor, LaCo merging) are defined on whole blocks and are refused."""
from __future__ import annotations

from swapkl.errors import ContractError

#: the methods a sublayer curve can run (the rest are block methods)
UNIT_METHODS = ("replacement", "interchange", "anti-replacement", "anti-interchange", "random", "bi", "sleb",
                "recommend")


def unit_key_suffix(unit: str) -> str:
    """What a unit adds to a memo text key: nothing for blocks (their keys stay as they were)."""
    return "" if unit == "block" else f"|unit:{unit}"


def check_unit_run(model, unit: str, specs) -> str:
    """``unit`` when ``model`` has it and every method of ``specs`` applies to it; else a one-line error
    (:class:`~swapkl.errors.ContractError`, or :class:`~swapkl.model.units.UnsupportedUnit` naming the family)."""
    from swapkl.model.units import check_unit  # deferred: pulls torch

    check_unit(unit)
    if unit == "block":
        return unit
    bad = [s.name for s in specs if s.name not in UNIT_METHODS]
    if bad:
        raise ContractError(f"method(s) {', '.join(bad)} remove whole blocks only; for --unit {unit} choose from: "
                            f"{', '.join(UNIT_METHODS)}")
    from swapkl.model import architectures as arch
    from swapkl.model.units import layout_for

    layout_for(model, arch.locate(model))
    return unit
