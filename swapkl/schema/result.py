"""A ``score --json`` result file (:class:`~swapkl.scoring.results.SwapResult`)."""
from __future__ import annotations

import math
import re
from typing import Any

import numpy as np


from swapkl.schema.fields import _array, _at, _document, _fail, _fields, _int, _Invalid, _is_int, _json, _number, _object, _plain_numbers, _show, _skip, _text, contract, identity, MAX_INT, MAX_KL, MAX_LAYERS, MAX_VALUES, RESULT_FORMAT


def result_fields(d: Any, what: str = "result file") -> dict:
    """Check a parsed ``score --json`` result (format ``swapkl.result/1``) and return the keyword arguments of
    :class:`~swapkl.scoring.results.SwapResult`: ``num_layers``, ``pairs`` (tuples), ``per_prompt`` (``{"repl": {(i, j):
    array}, "inter": {...}}``, KL per prompt in nats), ``contract``, ``identity``, ``prompt_token_ids``,
    ``prompts_info``, ``noise_floor`` (nats or None), ``meta``.  Raises :class:`UploadError`."""
    with _document(what):
        d = _object(d, "", "(not a swapkl result file?)")
        for key in ("num_layers", "pairs", "per_prompt", "contract"):
            if key not in d:
                raise _Invalid(f"{key} is missing (not a swapkl result file?)")
        L = _int(d["num_layers"], "num_layers", 1, MAX_LAYERS)
        pairs = _pairs(d["pairs"], "pairs", L)
        per_prompt = _per_prompt(d["per_prompt"], "per_prompt", pairs)
        spec = {
            "format": lambda v, w: _text(v, w, choices=(RESULT_FORMAT,)),
            "swapkl_version": _text,
            "num_layers": _skip, "pairs": _skip, "per_prompt": _skip,
            "replacement_directed": lambda v, w: _matrix(v, w, L, MAX_KL),
            "replacement": lambda v, w: _matrix(v, w, L, MAX_KL),
            "interchange": lambda v, w: _matrix(v, w, L, MAX_KL),
            "gap": lambda v, w: _matrix(v, w, L, MAX_KL),
            "contract": contract,
            "model": identity,
            "prompt_token_ids": _token_ids,
            "prompts": lambda v, w: _json(_object(v, w), w),
            "noise_floor": lambda v, w: _number(v, w, -MAX_KL, MAX_KL, null=True),
            "summary": lambda v, w: _json(_object(v, w), w),
            "meta": _meta,
            "undefined": lambda v, w: _undefined(v, w, L, pairs),
        }
        f = _fields(d, "", spec, extra=_json)
    return {"num_layers": L, "pairs": pairs,
            "per_prompt": {name: {k: np.asarray(v, dtype=float) for k, v in vecs.items()}
                           for name, vecs in per_prompt.items()},
            "contract": f["contract"], "identity": f.get("model", {}),
            "prompt_token_ids": f.get("prompt_token_ids", []), "prompts_info": f.get("prompts", {}),
            "noise_floor": f.get("noise_floor"), "meta": f.get("meta", {}), "undefined": f.get("undefined", {})}


# ============================================================================================ result parts
def _pairs(x, where: str, L: int) -> list[tuple[int, int]]:
    """Distinct layer pairs (i, j), 0 <= i < j < L."""
    most = L * (L - 1) // 2
    x = _array(x, where, most, f"has more pairs than a {L}-layer model has ({most})")
    seen: set = set()
    out = []
    for k, p in enumerate(x):
        w = f"{where}[{k}]"
        p = _pair(p, w, L)
        if p in seen:
            _fail(w, p, "is listed twice")
        seen.add(p)
        out.append(p)
    return out


def _undefined(x, where: str, L: int, pairs: list) -> dict:
    """``[[i, j, reason], ...]``: pairs without a value under the per-layer definition, each with its one-line
    reason (a bounded string), none of them among the computed ``pairs``."""
    most = L * (L - 1) // 2
    x = _array(x, where, most, f"has more pairs than a {L}-layer model has ({most})")
    computed = set(pairs)
    out: dict = {}
    for k, item in enumerate(x):
        w = f"{where}[{k}]"
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            _fail(w, item, "is not [i, j, reason]")
        p = _pair(item[:2], w, L)
        if p in computed or p in out:
            _fail(w, p, "is a computed pair or listed twice")
        out[p] = _text(item[2], f"{w}[2]")
    return out


def _pair(p, where: str, L: int, ordered: bool = True) -> tuple[int, int]:
    if not isinstance(p, (list, tuple)) or len(p) != 2 or not all(_is_int(v) for v in p):
        _fail(where, p, "is not a pair [i, j] of layer indices")
    i, j = int(p[0]), int(p[1])
    if not (0 <= i < L and 0 <= j < L):
        _fail(where, (i, j), f"is outside 0..{L - 1}")
    if ordered and i >= j:
        _fail(where, (i, j), "is not ordered i < j")
    return i, j


_PAIR_KEY = re.compile(r"(0|[1-9][0-9]{0,5}),(0|[1-9][0-9]{0,5})")


def _per_prompt(x, where: str, pairs: list) -> dict:
    """``{"replacement_directed": {"i,j": [P], "j,i": [P]}, "interchange": {"i,j": [P]}}`` for exactly the
    result's pairs; every vector of the same length P >= 1; at most :data:`MAX_VALUES` numbers in all."""
    x = _object(x, where)
    for key in x:
        if key not in ("replacement_directed", "interchange"):
            raise _Invalid(f"{_at(where, key)} is not a per-prompt protocol (replacement_directed, interchange)")
    for key in ("replacement_directed", "interchange"):
        if key not in x and pairs:
            raise _Invalid(f"{_at(where, key)} is missing")
    both = [q for i, j in pairs for q in ((i, j), (j, i))]
    shape = {"length": None, "total": 0}
    repl = _vectors(x.get("replacement_directed"), _at(where, "replacement_directed"), both, shape)
    inter = _vectors(x.get("interchange"), _at(where, "interchange"), pairs, shape)
    return {"repl": repl, "inter": inter}


def _vectors(x, where: str, keys: list, shape: dict) -> dict:
    if x is None and not keys:
        return {}
    x = _object(x, where)
    wanted = set(keys)
    out = {}
    for k, v in x.items():
        m = _PAIR_KEY.fullmatch(k) if isinstance(k, str) else None
        key = (int(m.group(1)), int(m.group(2))) if m else None
        if key not in wanted:
            raise _Invalid(f"{where} has the key {_show(k)}, which is not one of the result's pairs")
        out[key] = _kl_vector(v, f'{where}["{k}"]', shape)
    for key in keys:
        if key not in out:
            raise _Invalid(f'{where}["{key[0]},{key[1]}"] is missing')
    return out


def _kl_vector(v, where: str, shape: dict) -> list:
    """KL per prompt (nats): a non-empty list of finite numbers, |x| <= MAX_KL, as long as the others."""
    v = _array(v, where, MAX_VALUES)
    n = shape["length"]
    if n is None:
        if not v:
            _fail(where, v, "is empty (one KL per prompt)")
        shape["length"] = n = len(v)
    if len(v) != n:
        _fail(where, v, f"has {len(v)} values; the other per-prompt vectors have {n}")
    shape["total"] += n
    if shape["total"] > MAX_VALUES:
        raise _Invalid(f"per_prompt holds more than {MAX_VALUES} values")
    if not _plain_numbers(v, MAX_KL):
        for k, x in enumerate(v):
            _number(x, f"{where}[{k}]", -MAX_KL, MAX_KL)
    return v


def _matrix(x, where: str, L: int | None, bound: float, size_of: str = "num_layers") -> list:
    """An L×L matrix (L given, by ``size_of``; or any square 1..MAX_LAYERS) of numbers |x| <= bound or null."""
    rows = _array(x, where, MAX_LAYERS, f"has more than {MAX_LAYERS} rows")
    n = len(rows) if L is None else L
    if n < 1:
        _fail(where, rows, "is empty")
    if len(rows) != n:
        _fail(where, rows, f"has {len(rows)} rows, not {n} ({size_of})")
    for r, row in enumerate(rows):
        w = f"{where}[{r}]"
        row = _array(row, w, MAX_LAYERS)
        if len(row) != n:
            _fail(w, row, f"has {len(row)} values; the matrix is {n}×{n}")
        if not _plain_numbers([v for v in row if v is not None], bound):
            for c, v in enumerate(row):
                _number(v, f"{w}[{c}]", -bound, bound, null=True)
    return rows


def _token_ids(x, where: str) -> list:
    rows = _array(x, where, MAX_VALUES)
    total = 0
    for r, row in enumerate(rows):
        w = f"{where}[{r}]"
        row = _array(row, w, MAX_VALUES)
        total += len(row)
        if total > MAX_VALUES:
            raise _Invalid(f"{where} holds more than {MAX_VALUES} token ids")
        if row and not (set(map(type, row)) <= {int} and min(row) >= 0 and max(row) < 2 ** 31):
            for c, t in enumerate(row):
                _int(t, f"{w}[{c}]", 0, 2 ** 31 - 1)
    return rows


def _meta(x, where: str) -> dict:
    spec = {"seconds": lambda v, w: _number(v, w, 0, math.inf, null=True),
            "computed_pairs": lambda v, w: _int(v, w, 0, MAX_INT, null=True),
            "cached_pairs": lambda v, w: _int(v, w, 0, MAX_INT, null=True),
            "device": lambda v, w: _text(v, w, null=True),
            "swapkl_version": lambda v, w: _text(v, w, null=True)}
    return _fields(x, where, spec, extra=_json)
