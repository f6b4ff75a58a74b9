"""Validation of a comparison file (``swapkl compare --json``, :class:`swapkl.compare.result.CompareResult`) that comes
from outside: the format tag, both sides' model identity and contract, per protocol the emitted vectors and the
coefficients with their CIs, the transfer table's rows; everything else plain JSON (bounded depth, finite numbers)."""
from __future__ import annotations

from typing import Any

from swapkl.schema.fields import (MAX_INT, MAX_LAYERS, _array, _document, _fail, _fields, _int, _json, _number,
                                  _object, _text, contract, identity)

COMPARE_FORMAT = "swapkl.compare/1"
PROTOCOLS = ("replacement", "interchange")
WORDS = ("better", "tie", "worse")
MAX_PAIRS = MAX_LAYERS * (MAX_LAYERS - 1) // 2


def _coef(x, where: str) -> dict:
    ci = lambda v, w: [_number(e, f"{w}[{k}]", -1.0, 1.0, null=True) for k, e in enumerate(_array(v, w, 2))]
    return _fields(x, where, {"value": lambda v, w: _number(v, w, -1.0, 1.0, null=True), "ci": ci},
                   required=("value", "ci"))


def _vector(x, where: str) -> list:
    return [_number(v, f"{where}[{k}]", null=True) for k, v in enumerate(_array(x, where, MAX_PAIRS))]


def _protocol(x, where: str) -> dict:
    return _fields(x, where, {"spearman": _coef, "kendall": _coef, "a": _vector, "b": _vector},
                   required=("spearman", "kendall"), extra=_json)


def _side(x, where: str) -> dict:
    return _fields(x, where, {"model": identity, "contract": contract}, required=("model", "contract"), extra=_json)


def _set(x, where: str) -> list:
    return [_int(i, f"{where}[{k}]", 0, MAX_LAYERS - 1) for k, i in enumerate(_array(x, where, MAX_LAYERS))]


def _ci(x, where: str) -> list:
    if len(_array(x, where, 2)) != 2:
        _fail(where, x, "is not a [low, high] pair")
    return [_number(e, f"{where}[{k}]", null=True) for k, e in enumerate(x)]


def _row(x, where: str) -> dict:
    num = lambda v, w: _number(v, w, null=True)
    return _fields(x, where, {"n": lambda v, w: _int(v, w, 1, MAX_LAYERS), "set_a": _set, "set_b": _set,
                              "word": lambda v, w: _text(v, w, WORDS), "diff": num, "ci": _ci, "delta_a": num,
                              "delta_b": num}, required=("n", "set_a", "set_b", "diff", "ci", "word"), extra=_json)


def _transfer(x, where: str) -> dict | None:
    if x is None:
        return None

    def protocols(v, w):
        v = _object(v, w)
        out = {}
        for p, rows in v.items():
            if p not in PROTOCOLS:
                _fail(w, p, "is not a protocol (replacement, interchange)")
            out[p] = [_row(r, f"{w}.{p}[{k}]") for k, r in enumerate(_array(rows, f"{w}.{p}", MAX_LAYERS))]
        return out
    return _fields(x, where, {"protocols": protocols, "baseline_ppl": lambda v, w: _number(v, w, 0.0),
                              "n_windows": lambda v, w: _int(v, w, 0, MAX_INT)},
                   required=("protocols", "baseline_ppl", "n_windows"), extra=_json)


def compare_fields(d: Any, what: str = "comparison") -> dict:
    """The :class:`CompareResult` fields of ``d``, validated; raises one-line :class:`UploadError`."""
    with _document(what):
        d = _object(d, "", "(a 'swapkl compare --json' file)")
        if d.get("format") != COMPARE_FORMAT:
            _fail("format", d.get("format"), f"is not {COMPARE_FORMAT!r}")

        def agreement(v, w):
            return _fields(v, w, {p: _protocol for p in PROTOCOLS}, required=PROTOCOLS, extra=_json)
        f = _fields(d, "", {"a": _side, "b": _side, "agreement": agreement, "transfer": _transfer,
                            "notes": lambda v, w: [_text(e, f"{w}[{k}]") for k, e in enumerate(_array(v, w, 1024))]},
                    required=("a", "b", "agreement"), extra=_json)
        return {k: f.get(k) for k in ("a", "b", "agreement", "transfer")} | {"notes": f.get("notes") or []}
