"""The bridge's settings, validated in one place: :class:`BridgeSettings` (docs/repair.md).  Built once at the edge
(a command's arguments, the dashboard's form, a request) as part of a removal plan or a run's contract and passed on
as the object; nothing downstream checks its fields again.  No torch here: the plan and the dashboard build it
before torch is loaded."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Mapping

from swapkl.errors import ContractError
from swapkl.repair import forms
from swapkl.repair.fit import DEFAULT_RIDGE

#: calibration tokens of a bridge fit (and the default of a calibration method's ``--calib-tokens``)
DEFAULT_CALIB_TOKENS = 8192
#: tokens per calibration window
DEFAULT_CALIB_WINDOW = 256
#: the least calibration tokens any calibration reads (a bridge's, or a calibration method's)
MIN_CALIB_TOKENS = 16


def _int(name: str, v, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ContractError(f"{name} must be an integer of at least {lo} (got {v!r})")
    return int(v)


@dataclass(frozen=True)
class BridgeSettings:
    """The bridge's part of the evaluation contract: the ``form`` (a name of :mod:`swapkl.repair.forms`; the folded
    form falls back to the residual one per span where no exact fold exists), the calibration tokens, window
    (tokens) and seed, and the relative ``ridge`` ε (≥ 0).  Each refusal is one line (:class:`ContractError`)."""

    form: str = forms.DEFAULT
    calib_tokens: int = DEFAULT_CALIB_TOKENS
    calib_window: int = DEFAULT_CALIB_WINDOW
    calib_seed: int = 0
    ridge: float = DEFAULT_RIDGE

    def __post_init__(self):
        forms.get(self.form)
        for name, what, lo in (("calib_window", "calibration window", 2), ("calib_seed", "calibration seed", 0),
                               ("calib_tokens", "calibration tokens", 0)):
            _int(f"the bridge's {what}", getattr(self, name), lo)
        n, w = self.calib_tokens, self.calib_window
        if n < MIN_CALIB_TOKENS and n < w:
            raise ContractError(f"the bridge's calibration tokens must be an integer of at least {MIN_CALIB_TOKENS} "
                                f"(got {n}), and --calib-tokens must be at least the calibration window ({w})")
        if n < w:
            raise ContractError(f"--calib-tokens ({n}) must be at least the calibration window ({w})")
        _int("the bridge's calibration tokens", n, MIN_CALIB_TOKENS)
        r = self.ridge
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not r >= 0 or math.isinf(r):
            raise ContractError(f"the bridge's ridge must be a finite number >= 0 (got {r!r})")
        object.__setattr__(self, "ridge", float(r))

    @property
    def kind(self) -> forms.BridgeForm:
        """The asked form as its :class:`~swapkl.repair.forms.BridgeForm`."""
        return forms.get(self.form)

    @classmethod
    def from_dict(cls, d: Mapping | BridgeSettings | None) -> BridgeSettings:
        """The settings of a dict of its fields (None values and an empty or None dict: the defaults); an unknown
        field is refused in one line."""
        if isinstance(d, BridgeSettings):
            return d
        if d is not None and not isinstance(d, Mapping):
            raise ContractError(f"bridge settings must be a dict of {', '.join(FIELDS)} (got {d!r})")
        d = {str(k): v for k, v in (d or {}).items() if v is not None}
        bad = sorted(set(d) - set(FIELDS))
        if bad:
            raise ContractError(f"unknown bridge setting(s) {', '.join(bad)}; known: {', '.join(FIELDS)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


#: the field names, in order
FIELDS = tuple(f.name for f in fields(BridgeSettings))
