"""Validation of a study file (``swapkl study --json``, :class:`swapkl.study.result.StudyResult`) that comes from
outside: the format tag, the contract, each row's model and status, the numbers the table and figures read (the
removal rows' n and ΔPPL, the ratios, the ρ values in [-1, 1]); everything else plain JSON (bounded depth, finite
numbers)."""
from __future__ import annotations

from typing import Any

from swapkl.schema.fields import (MAX_LAYERS, _array, _document, _fail, _fields, _int, _json, _number, _object,
                                  _text)

STUDY_FORMAT = "swapkl.study/1"
MAX_MODELS = 1000
STATUSES = ("done", "failed")
WORDS = ("better", "tie", "worse")


def _model(x, where: str) -> dict:
    return _fields(x, where, {"spec": lambda v, w: _text(v, w), "label": lambda v, w: _text(v, w),
                              "revision": lambda v, w: _text(v, w, null=True)}, required=("spec", "label"))


def _ci(x, where: str, lo=float("-inf"), hi=float("inf")) -> list:
    return [_number(e, f"{where}[{k}]", lo, hi, null=True) for k, e in enumerate(_array(x, where, 2))]


def _removal_row(x, where: str) -> dict:
    return _fields(x, where, {"n": lambda v, w: _int(v, w, 1, MAX_LAYERS),
                              "ratio": lambda v, w: _number(v, w, null=True), "ratio_ci": _ci,
                              "diff": lambda v, w: _number(v, w, null=True), "diff_ci": _ci,
                              "word": lambda v, w: _text(v, w, WORDS, null=True)},
                   required=("n", "replacement", "interchange"), extra=_json)


def _removal(x, where: str) -> dict:
    return _fields(x, where, {"rows": lambda v, w: [_removal_row(r, f"{w}[{k}]")
                                                      for k, r in enumerate(_array(v, w, MAX_LAYERS))]},
                   required=("rows",), extra=_json)


def _rho(x, where: str) -> dict:
    return _fields(x, where, {"rho": lambda v, w: _number(v, w, -1.0, 1.0, null=True),
                              "ci": lambda v, w: _ci(v, w, -1.0, 1.0)}, extra=_json)


def _predictors(x, where: str) -> dict | None:
    if x is None:
        return None
    part = lambda v, w: None if v is None else _fields(v, w, {"replacement": _rho, "interchange": _rho},
                                                       extra=_json)
    return _fields(x, where, {"raw": part, "bridged": part}, required=("raw",), extra=_json)


def _row(x, where: str) -> dict:
    r = _fields(x, where, {"model": _model, "status": lambda v, w: _text(v, w, STATUSES),
                           "layers": lambda v, w: _int(v, w, 1, MAX_LAYERS), "removal": _removal,
                           "evidence": _predictors}, required=("model", "status"), extra=_json)
    if r["status"] == "done":
        for key in ("layers", "removal", "gap", "verdict"):
            if key not in r:
                _fail(where, key, "is missing from a finished row")
    return r


def study_fields(d: Any, what: str = "study") -> dict:
    """The :class:`StudyResult` fields of ``d``, validated; raises one-line :class:`UploadError`."""
    with _document(what):
        d = _object(d, "", "(a 'swapkl study --json' file)")
        if d.get("format") != STUDY_FORMAT:
            _fail("format", d.get("format"), f"is not {STUDY_FORMAT!r} (a 'swapkl study --json' file)")
        f = _fields(d, "", {"format": _json, "contract": lambda v, w: _json(_object(v, w), w),
                            "rows": lambda v, w: [_row(r, f"{w}[{k}]")
                                                  for k, r in enumerate(_array(v, w, MAX_MODELS))],
                            "shard": lambda v, w: None if v is None else [_int(e, f"{w}[{k}]", 1, MAX_MODELS)
                                                                          for k, e in enumerate(_array(v, w, 2))],
                            "notes": lambda v, w: [_text(e, f"{w}[{k}]") for k, e in enumerate(_array(v, w, 1024))],
                            "complete": _json}, required=("contract", "rows"))
        return {"contract": f["contract"], "rows": f["rows"], "shard": f.get("shard"), "notes": f.get("notes") or [],
                "complete": bool(f.get("complete", True))}
