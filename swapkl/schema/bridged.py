"""A bridged swap-KL result file (``swapkl bridge --json``, format ``swapkl.bridged/1``): the third matrix's spans."""
from __future__ import annotations

from typing import Any

from swapkl.schema.fields import (MAX_KL, MAX_LAYERS, MAX_VALUES, _array, _document, _fail, _fields, _int, _Invalid,
                                  _json, _number, _object, _plain_numbers, _text, contract, identity)

FORMAT = "swapkl.bridged/1"
_SETTINGS = {"form": lambda v, w: _text(v, w, choices=("folded", "residual")),
             "calib_tokens": lambda v, w: _int(v, w, 2, 10 ** 9), "calib_window": lambda v, w: _int(v, w, 2, 10 ** 7),
             "calib_seed": lambda v, w: _int(v, w, -2 ** 63, 2 ** 63 - 1),
             "ridge": lambda v, w: _number(v, w, 0.0, 1e6)}


def _vector(v, where: str, n: int | None) -> list:
    v = _array(v, where, MAX_VALUES)
    if not v or (n is not None and len(v) != n):
        _fail(where, len(v), f"has {len(v)} values, not one per prompt ({n})")
    if not _plain_numbers(v, MAX_KL):
        for k, x in enumerate(v):
            _number(x, f"{where}[{k}]", -MAX_KL, MAX_KL)
    return [float(x) for x in v]


def bridged_result(d: Any, what: str = "bridged swap-KL file") -> dict:
    """Check a bridged result: ``format``, ``num_layers`` (1..:data:`MAX_LAYERS`), ``contract``, ``settings``,
    ``spans`` (each ``{"span": [i, j], "bridged": [P], "raw": [P], "fit": {...}}`` with ``0 <= i < j <= L``, one
    value per prompt of the contract, nats) and the optional ``identity``, ``calibration``, ``meta``.  Returns it;
    raises :class:`~swapkl.errors.UploadError` naming the first problem."""
    with _document(what):
        d = _object(d, "", "(not a swapkl bridged result?)")
        if d.get("format") != FORMAT:
            raise _Invalid(f"format is not {FORMAT} (not a swapkl bridged result)")
        f = _fields(d, "", {"format": _json, "num_layers": lambda v, w: _int(v, w, 1, MAX_LAYERS),
                            "contract": contract, "settings": lambda v, w: _fields(v, w, _SETTINGS),
                            "identity": identity, "calibration": _json, "meta": _json, "spans": _json},
                    required=("num_layers", "contract", "settings", "spans"))
        L, P = f["num_layers"], f["contract"].get("prompts")
        spans = _array(f["spans"], "spans", MAX_LAYERS * (MAX_LAYERS + 1) // 2)
        if len(spans) * (P or 1) > MAX_VALUES:
            raise _Invalid(f"spans hold more than {MAX_VALUES} values")
        seen = set()
        for k, s in enumerate(spans):
            w = f"spans[{k}]"
            s = _fields(s, w, {"span": lambda v, x: _array(v, x, 2), "bridged": lambda v, x: _vector(v, x, P),
                                "raw": lambda v, x: _vector(v, x, P), "fit": _json},
                        required=("span", "bridged", "raw"))
            i, j = (_int(x, f"{w}.span", 0, L) for x in s["span"]) if len(s["span"]) == 2 else (None, None)
            if i is None or not i < j:
                _fail(f"{w}.span", s["span"], f"is not a span [i, j) with 0 <= i < j <= {L}")
            if (i, j) in seen:
                _fail(f"{w}.span", s["span"], "appears twice")
            seen.add((i, j))
    return d
