"""Validation of a study file (``swapkl study --json``, :class:`swapkl.study.result.StudyResult`) that comes from
outside: the format tag, the contract, each row's model (its strings as plain text: a figure draws them) and status, the numbers the table and figures read (the
removal rows' n and ΔPPL, the ratios, the ρ values in [-1, 1]); everything else plain JSON (bounded depth, finite
numbers)."""
from __future__ import annotations

import math
from typing import Any

from swapkl.schema.fields import _number as _checked_number
from swapkl.schema.fields import (MAX_LAYERS, _array, _document, _fail, _fields, _int, _json, _object,
                                  _text)
from swapkl.schema.text import plain_text

STUDY_FORMAT = "swapkl.study/1"
MAX_MODELS = 1000
STATUSES = ("done", "failed")
WORDS = ("better", "tie", "worse")
PROTOCOLS = ("replacement", "interchange")
MAX_REPLICATES = 100_000  # bootstrap replicates of a row's layer order


def _number(x, where: str, lo: float = -math.inf, hi: float = math.inf, null: bool = False):
    """:func:`swapkl.schema.fields._number` (finite, in range, null where allowed), an integer kept an integer: a
    study file reads back exactly as it was written (a finished study is served from its snapshot)."""
    v = _checked_number(x, where, lo, hi, null)
    return x if type(x) is int else v


def _plain(v, where: str, null: bool = False) -> str | None:
    """A string of the file that a figure or the report draws: its markup removed (:func:`plain_text`)."""
    t = _text(v, where, null=null)
    return None if t is None else plain_text(t)


def _model(x, where: str) -> dict:
    return _fields(x, where, {"spec": _plain, "label": _plain, "revision": lambda v, w: _plain(v, w, null=True)},
                   required=("spec", "label"))


def _ci(x, where: str, lo=float("-inf"), hi=float("inf"), null: bool = False) -> list:
    """A ``[low, high]`` pair (each a number or null); with ``null`` also null itself (read as ``[null, null]``)."""
    if x is None and null:
        return [None, None]
    if len(_array(x, where, 2)) != 2:
        _fail(where, x, "is not a [low, high] pair")
    return [_number(e, f"{where}[{k}]", lo, hi, null=True) for k, e in enumerate(x)]


def _num(v, w):
    return _number(v, w, null=True)


def _guided(x, where: str) -> dict:
    """One protocol's removal at n: the set, its held-out ΔPPL % and CI (the grid and the statements read them)."""
    return _fields(x, where, {"removed": lambda v, w: [_int(e, f"{w}[{k}]", 0, MAX_LAYERS - 1)
                                                       for k, e in enumerate(_array(v, w, MAX_LAYERS))],
                              "delta_pct": _number, "delta_pct_ci": _ci}, required=("delta_pct",), extra=_json)


def _baseline(x, where: str) -> dict | None:
    return None if x is None else _fields(x, where, {"method": lambda v, w: _plain(v, w), "delta_pct": _number},
                                          required=("method", "delta_pct"), extra=_json)


def _removal_row(x, where: str) -> dict:
    return _fields(x, where, {"n": lambda v, w: _int(v, w, 1, MAX_LAYERS), "ratio": _num, "ratio_ci": _ci,
                              "diff": _num, "diff_ci": _ci, "word": lambda v, w: _text(v, w, WORDS, null=True),
                              "replacement": _guided, "interchange": _guided, "best_baseline": _baseline},
                   required=("n", "replacement", "interchange", "ratio", "ratio_ci", "word"), extra=_json)


def _removal(x, where: str) -> dict:
    return _fields(x, where, {"rows": lambda v, w: [_removal_row(r, f"{w}[{k}]")
                                                      for k, r in enumerate(_array(v, w, MAX_LAYERS))]},
                   required=("rows",), extra=_json)


def _rho(x, where: str) -> dict:
    return _fields(x, where, {"rho": lambda v, w: _number(v, w, -1.0, 1.0, null=True),
                              "ci": lambda v, w: _ci(v, w, -1.0, 1.0)}, required=("rho", "ci"), extra=_json)


def _part(x, where: str) -> dict | None:
    """One part (raw or bridged) of a row's predictor validity: ρ per protocol, the best signal, the pick."""
    if x is None:
        return None
    pick = lambda v, w: None if v is None else _fields(v, w, {"winner": lambda u, z: _plain(u, z, null=True)},
                                                       required=("winner",), extra=_json)
    return _fields(x, where, {"replacement": _rho, "interchange": _rho, "best": lambda v, w: _plain(v, w, null=True),
                              "best_rho": lambda v, w: _number(v, w, -1.0, 1.0, null=True),
                              "best_ci": lambda v, w: _ci(v, w, -1.0, 1.0, null=True), "pick": pick},
                   required=("replacement", "interchange"), extra=_json)


def _predictors(x, where: str) -> dict | None:
    if x is None:
        return None
    return _fields(x, where, {"raw": _part, "bridged": _part}, required=("raw",), extra=_json)


def _order(x, where: str, pairs: int) -> dict:
    """Per protocol the adjacent pairs' scores (``pairs`` = layers - 1 of them) and their bootstrap replicates."""
    def protocol(v, w):
        f = _fields(v, w, {"values": lambda u, z: [_num(e, f"{z}[{k}]") for k, e in enumerate(_array(u, z, pairs))],
                           "replicates": lambda u, z: [[_num(e, f"{z}[{i}][{k}]") for k, e in enumerate(_array(
                               rep, f"{z}[{i}]", pairs))] for i, rep in enumerate(_array(u, z, MAX_REPLICATES))]},
                    required=("values", "replicates"), extra=_json)
        if not f["replicates"] or any(len(rep) != pairs for rep in (f["values"], *f["replicates"])):
            _fail(w, "values", f"do not hold one score per adjacent pair ({pairs}), with at least one replicate")
        return f
    return _fields(x, where, {"replacement": protocol, "interchange": protocol}, required=PROTOCOLS, extra=_json)


def _row(x, where: str) -> dict:
    r = _fields(x, where, {"model": _model, "status": lambda v, w: _text(v, w, STATUSES),
                           "layers": lambda v, w: _int(v, w, 1, MAX_LAYERS), "removal": _removal,
                           "evidence": _predictors, "params": lambda v, w: _number(v, w, 0.0),
                           "gap": lambda v, w: _fields(v, w, {"median": _num, "ci": _ci}, required=("median", "ci"),
                                                       extra=_json),
                           "verdict": lambda v, w: _fields(v, w, {"regime": lambda u, z: _plain(u, z, null=True)},
                                                           extra=_json),
                           "cost": lambda v, w: _fields(v, w, {"seconds": lambda u, z: _number(u, z, 0.0, null=True),
                                                               "peak_bytes": lambda u, z: _number(u, z, 0.0, null=True)},
                                                        extra=_json),
                           "error": lambda v, w: _plain(v, w, null=True)},
                extra=_json, required=("model", "status"))
    if r["status"] == "done":
        for key in ("layers", "removal", "gap", "verdict", "params"):
            if key not in r:
                _fail(where, key, "is missing from a finished row")
        if r.get("order") is not None:
            r["order"] = _order(r["order"], f"{where}.order", r["layers"] - 1)
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
                            "notes": lambda v, w: [_plain(e, f"{w}[{k}]") for k, e in enumerate(_array(v, w, 1024))],
                            "complete": _json}, required=("contract", "rows"))
        return {"contract": f["contract"], "rows": f["rows"], "shard": f.get("shard"), "notes": f.get("notes") or [],
                "complete": bool(f.get("complete", True))}
