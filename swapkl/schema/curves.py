"""A ``curves --json`` file (:class:`~swapkl.removal.curves.CurvesResult`)."""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any



from swapkl.schema.fields import _array, _at, _bool, _CORPUS, _document, _evaluator, _fail, _fields, _int, _Invalid, _is_int, _json, _number, _object, _scalar, _skip, _text, identity, MAX_INT, MAX_KL, MAX_LAYERS, MAX_METHODS, MAX_SEEDS, PREFERENCES, REGIMES
from swapkl.schema.result import _pair
from swapkl.contract import check_unit


def curves_fields(d: Any, what: str = "curves file") -> dict:
    """Check a parsed ``curves --json`` file and return the keyword arguments of
    :class:`~swapkl.removal.curves.CurvesResult` (``model`` as a dict; optional fields filled with their defaults).
    Perplexities must be positive and finite, ΔPPL % finite, removed layers valid indices of the model
    (``model.num_layers`` when given, else < :data:`MAX_LAYERS`).  Raises :class:`UploadError`."""
    with _document(what):
        d = _object(d, "", "(not a swapkl curves file?)")
        for key in ("model", "evaluator", "budget", "baseline_ppl", "methods"):
            if key not in d:
                raise _Invalid(f"{key} is missing (not a swapkl curves file?)")
        model = identity(d["model"], "model")
        L = model.get("num_layers") or MAX_LAYERS
        entries = lambda v, w: _curve(v, w, L)
        spec = {
            "model": _skip,
            "evaluator": _evaluator,
            "corpus": lambda v, w: _fields(v, w, _CORPUS, extra=_scalar),
            "budget": lambda v, w: _int(v, w, 0, MAX_LAYERS),
            "selection": lambda v, w: _selection(v, w, L),
            "baseline_ppl": _ppl,
            "baseline_ppl_ci": lambda v, w: _ci(v, w, allow_empty=True),
            "baseline": lambda v, w: _json(_object(v, w), w),
            "methods": lambda v, w: _by_method(v, w, entries),
            "method_info": lambda v, w: _by_method(v, w, lambda x, y: _json(_object(x, y), y)),
            "random_seeds": lambda v, w: _by_method(v, w, lambda x, y: _seed_curves(x, y, entries)),
            "delta_ratio": _delta_ratio,
            "verdict": lambda v, w: None if v is None else _verdict(v, w, L),
            "stats": lambda v, w: _json(_object(v, w), w),
            "notes": lambda v, w: [_text(x, f"{w}[{k}]") for k, x in enumerate(_array(v, w, 1000))],
            "complete": _bool,
            "unit": _unit,
            "sizes": lambda v, w: _json(_object(v, w), w),
            "gains": lambda v, w: _json(_object(v, w), w),
            "plan": lambda v, w: _json(_object(v, w), w),
            "repaired": lambda v, w: _by_method(v, w, entries),
            "repair": lambda v, w: _json(_object(v, w), w),
        }
        f = _fields(d, "", spec, extra=_json)
    out = {"model": model, "corpus": {}, "selection": {}, "baseline_ppl_ci": [], "baseline": {}}
    out.update((k, v) for k, v in f.items() if k in spec and spec[k] is not _skip)
    return out


# ============================================================================================ curves parts
def _unit(x, where: str) -> str:
    """A unit of analysis (:data:`swapkl.contract.UNITS`)."""
    return check_unit(x, lambda message: _Invalid(f"{where or 'the top level'}: {message}"))


def _ppl(x, where: str, null: bool = False) -> float | None:
    """A perplexity: a finite number > 0."""
    v = _number(x, where, 0, math.inf, null=null)
    if v == 0:
        _fail(where, x, "is not a positive perplexity")
    return v


def _ci(x, where: str, allow_empty: bool = False, null: bool = True) -> list | None:
    """A confidence interval [lo, hi] of numbers (or nulls), or null."""
    if x is None and null:
        return None
    x = _array(x, where, 2)
    if not (len(x) == 2 or (allow_empty and not x)):
        _fail(where, x, "is not an interval [lo, hi]")
    return [_number(v, f"{where}[{k}]", null=True) for k, v in enumerate(x)]


def _layers(x, where: str, L: int, size: int | None = None) -> list[int]:
    """Distinct layer indices 0..L-1 (``size`` of them when given)."""
    x = _array(x, where, L, f"has more layers than the model ({L})")
    out = [_int(v, f"{where}[{k}]", 0, L - 1) for k, v in enumerate(x)]
    if len(set(out)) != len(out):
        _fail(where, x, "lists a layer twice")
    if size is not None and len(out) != size:
        _fail(where, x, f"removes {len(out)} layers, not n = {size}")
    return out


def _entry(x, where: str, L: int) -> dict:
    """One curve point ``{n, removed, ppl, ppl_ci, delta_pct, delta_pct_ci, kl_to_base, ...}``."""
    e = _object(x, where)
    for key in ("n", "ppl", "delta_pct"):
        if key not in e:
            raise _Invalid(f"{_at(where, key)} is missing")
    n = _int(e["n"], _at(where, "n"), 1, MAX_LAYERS)
    removed = lambda v, w: None if v is None else _layers(v, w, L, n)
    number = lambda v, w: _number(v, w, null=True)
    spec = {"n": _skip, "removed": removed, "ppl": _ppl, "ppl_ci": _ci, "delta_pct": _number,
            "delta_pct_ci": _ci, "kl_to_base": lambda v, w: _number(v, w, -MAX_KL, MAX_KL, null=True),
            "ppl_min": lambda v, w: _ppl(v, w, null=True), "ppl_max": lambda v, w: _ppl(v, w, null=True),
            "delta_pct_min": number, "delta_pct_max": number, "delta_pct_std": number,
            "n_seeds": lambda v, w: _int(v, w, 0, MAX_SEEDS, null=True),
            "paired_delta_pct": number, "paired_ci": _ci,
            "per_seed": lambda v, w: [_fields(s, f"{w}[{k}]", {
                "seed": lambda a, b: _int(a, b, -MAX_INT, MAX_INT), "removed": removed, "ppl": _ppl,
                "delta_pct": _number}, extra=_scalar) for k, s in enumerate(_array(v, w, MAX_SEEDS))]}
    out = _fields(e, where, spec, extra=_scalar)
    for lo, hi in (("delta_pct_min", "delta_pct_max"), ("ppl_min", "ppl_max")):  # a spread is drawn as a pair
        if (out.get(lo) is None) != (out.get(hi) is None):
            one = lo if out.get(lo) is not None else hi
            _fail(_at(where, one), out[one], f"comes without its other end ({hi if one == lo else lo})")
    out["n"] = n
    return out


def _curve(x, where: str, L: int) -> list[dict]:
    """A method's points, n strictly increasing."""
    x = _array(x, where, MAX_LAYERS)
    out, last = [], 0
    for k, e in enumerate(x):
        w = f"{where}[{k}]"
        e = _entry(e, w, L)
        if e["n"] <= last:
            _fail(_at(w, "n"), e["n"], f"does not follow n = {last}")
        last = e["n"]
        out.append(e)
    return out


def _by_method(x, where: str, check: Callable) -> dict:
    """``{method name: check(value)}``, at most MAX_METHODS names."""
    x = _object(x, where)
    if len(x) > MAX_METHODS:
        _fail(where, x, f"has more than {MAX_METHODS} methods")
    out = {}
    for name, v in x.items():
        if not (isinstance(name, str) and 0 < len(name) <= 64):
            _fail(where, name, "has a method name that is not a short string")
        out[name] = check(v, _at(where, name))
    return out


def _seed_curves(x, where: str, curve: Callable) -> dict:
    x = _object(x, where)
    if len(x) > MAX_SEEDS:
        _fail(where, x, f"has more than {MAX_SEEDS} seeds")
    for seed in x:
        if not re.fullmatch(r"-?[0-9]{1,19}", seed):
            _fail(where, seed, "has a key that is not a seed number")
    return {seed: curve(v, _at(where, seed)) for seed, v in x.items()}


def _delta_ratio(x, where: str) -> list:
    number = lambda v, w: _number(v, w, null=True)
    spec = {"n": lambda v, w: _int(v, w, 1, MAX_LAYERS), "ratio": number, "interchange_delta_pct": number,
            "replacement_delta_pct": number}
    return [_fields(r, f"{where}[{k}]", spec, required=("n", "ratio"), extra=_scalar)
            for k, r in enumerate(_array(x, where, MAX_LAYERS))]


def _selection(x, where: str, L: int) -> dict:
    def partners(v, w):
        if v is None or isinstance(v, str):
            return _text(v, w, null=True)
        if _is_int(v):
            return _int(v, w, 0, MAX_LAYERS)
        return [list(_pair(p, f"{w}[{k}]", L, ordered=False))
                for k, p in enumerate(_array(v, w, L * L))]

    spec = {"spacing": lambda v, w: _int(v, w, 0, MAX_LAYERS), "exclude_boundary": _bool,
            "candidates": lambda v, w: _layers(v, w, L), "partners": partners,
            "seeds": lambda v, w: [_int(s, f"{w}[{k}]", -MAX_INT, MAX_INT)
                                   for k, s in enumerate(_array(v, w, MAX_SEEDS))]}
    return _fields(x, where, spec, extra=_json)


def _verdict(x, where: str, L: int) -> dict:
    """The regime verdict of :func:`swapkl.scoring.verdict.regime_verdict` with its full evidence (the dashboard shows
    every field)."""
    count = lambda v, w: _int(v, w, 0, MAX_LAYERS * MAX_LAYERS)
    kl = lambda v, w: _number(v, w, -MAX_KL, MAX_KL)
    protocol = {"n_pairs": count, "below_0.05": count, "below_threshold": count, "min": kl, "median": kl,
                "best_pair": lambda v, w: list(_pair(v, w, L, ordered=False))}
    proto = lambda v, w: _fields(v, w, protocol, required=tuple(protocol), extra=None)

    def pairs(v, w):
        if isinstance(v, str):
            return _text(v, w, choices=("adjacent",))
        return [list(_pair(p, f"{w}[{k}]", L, ordered=False)) for k, p in enumerate(_array(v, w, L * L))]

    evidence = {"pairs": pairs, "threshold": kl, "strong_threshold": kl, "replacement": proto, "interchange": proto,
                "kl_ratio_median": lambda v, w: _number(v, w, null=True),
                "kl_ratio_best": lambda v, w: _number(v, w, null=True)}
    spec = {"regime": lambda v, w: _text(v, w, choices=REGIMES),
            "prefer": lambda v, w: _text(v, w, choices=PREFERENCES),
            "sentence": _text,
            "evidence": lambda v, w: _fields(v, w, evidence, required=("threshold", "replacement", "interchange"),
                                             extra=_json)}
    return _fields(x, where, spec, required=("regime", "prefer", "sentence", "evidence"), extra=_json)
