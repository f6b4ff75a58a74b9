"""Plain scores: ``{"replacement": L×L, "interchange": L×L}``."""
from __future__ import annotations

from typing import Any

import numpy as np


from swapkl.schema.fields import _document, _fields, _Invalid, _json, _object, _skip, contract, identity, MAX_KL
from swapkl.schema.result import _matrix


def score_matrices(d: Any, what: str = "scores file") -> tuple[dict, dict, dict]:
    """Check plain scores ``{"replacement": L×L, "interchange": L×L, "model"?: identity, "contract"?: {...}}``
    (nats, null where a pair was not scored; square, 1 <= L <= :data:`MAX_LAYERS`, both the same size) and return
    ``({"replacement": array, "interchange": array}, identity, contract)``.  Raises :class:`UploadError`."""
    with _document(what):
        d = _object(d, "", "(not a swapkl scores file?)")
        for key in ("replacement", "interchange"):
            if key not in d:
                raise _Invalid(f"{key} is missing (not a swapkl scores file: no replacement/interchange matrices)")
        L = len(_matrix(d["replacement"], "replacement", None, MAX_KL))
        same_size = lambda v, w: _matrix(v, w, L, MAX_KL, "the size of replacement")
        spec = {"replacement": _skip, "interchange": same_size, "model": identity, "contract": contract}
        f = _fields(d, "", spec, extra=_json)
    conv = lambda m: np.array([[np.nan if v is None else float(v) for v in row] for row in m], dtype=float)
    return ({"replacement": conv(d["replacement"]), "interchange": conv(d["interchange"])}, f.get("model", {}),
            f.get("contract", {}))
