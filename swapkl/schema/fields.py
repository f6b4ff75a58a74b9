"""The parts every validator shares: the size limits, the field primitives (numbers, text, arrays, objects with
their spec), the one-line error of a field, and the model identity and contract blocks."""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np

from swapkl.errors import ContractError, UploadError
from swapkl.contract import Contract



MAX_BYTES = 64 * 1024 * 1024   # bytes of JSON text accepted by default (a parameter of the readers)
MAX_DEPTH = 32                 # nesting levels of arrays/objects (swapkl's own files use at most 7)
MAX_LAYERS = 1024              # num_layers of a result; also the largest plain score matrix (L×L)
MAX_VALUES = 1 << 23           # numbers across all per-prompt vectors of one result (64 MiB as float64);
#                                also the bound on its prompt token ids
MAX_KL = 1e6                   # nats: |KL| beyond this is no measurement (bounds every mean and sum: no overflow)
MAX_STRING = 4096              # characters of a name, label, path or note
MAX_METHODS = 64               # removal methods in one curves file
MAX_SEEDS = 10_000             # random-baseline seeds in one curves file
MAX_INT = 2 ** 63 - 1          # any other integer (seeds, counters, token ids stay far below)

RESULT_FORMAT = "swapkl.result/1"
IDENTITY_KINDS = ("hub", "local", "gguf", "builtin")
REGIMES = ("divergent", "tied", "weak")
PREFERENCES = ("interchange", "replacement", "either", "neither")


class NonFinite:
    """A ``NaN``/``Infinity``/``-Infinity`` token read by ``parse_json(..., keep_constants=True)``: no number, so
    every validator refuses it, naming the field."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token

    def __repr__(self) -> str:
        return self.token


class _Invalid(Exception):
    """One problem at one field; :func:`_document` prefixes the file label and raises :class:`UploadError`."""


# ============================================================================================ documents
@contextmanager
def _document(what: str):
    """Turn the first field problem into ``UploadError("<what>: <problem>")``."""
    try:
        yield
    except _Invalid as e:
        raise UploadError(f"{what}: {e}") from None


# ============================================================================================ shared parts
def identity(x: Any, where: str = "model") -> dict:
    """A model identity: the dict :func:`swapkl.model.checkpoints.load_checkpoint` records (kind, id, revision,
    commit, fingerprint, display, model_type, family, num_layers, dtype; extra keys must be plain values), or a
    string, read as ``{"display": x}``."""
    if isinstance(x, str):
        return {"display": _text(x, where)}
    if not isinstance(x, dict):
        _fail(where, x, "is not a model name (string) or identity (object)")
    return _fields(x, where, _IDENTITY, extra=_scalar)


def contract(x: Any, where: str = "contract") -> dict:
    """An evaluation contract: the settings of :class:`~swapkl.contract.Contract` (types here, values by the
    Contract itself) plus the recorded ``corpus_label``/``corpus_sha256``.  Unknown keys are refused."""

    spec = dict(_CONTRACT)
    for name in Contract.__dataclass_fields__:  # a setting added to Contract later is known here at once
        spec.setdefault(name, _scalar)
    c = _fields(x, where, spec, extra=None)
    try:
        Contract.from_dict(c)
    except ContractError as e:  # its message may quote a 4096-character value, or one with a newline
        raise _Invalid(f"{where}: {_clip(str(e), 200)}") from None
    return c


def _evaluator(x, where: str) -> dict:
    size = lambda v, w: _int(v, w, 1, 10 ** 9)
    spec = {"name": _text, "max_words": size, "window": size, "stride": size, "drop_first_target": _bool}
    return _fields(x, where, spec, extra=_scalar)


_text_or_null = lambda v, w: _text(v, w, null=True)
_IDENTITY = {"kind": lambda v, w: _text(v, w, choices=IDENTITY_KINDS, null=True),
             "id": _text_or_null, "display": _text_or_null, "revision": _text_or_null, "commit": _text_or_null,
             "fingerprint": _text_or_null, "model_type": _text_or_null, "family": _text_or_null,
             "dtype": _text_or_null, "name_or_path": _text_or_null,
             "num_layers": lambda v, w: _int(v, w, 1, MAX_LAYERS, null=True)}
_CONTRACT = {"pairs": lambda v, w: _text(v, w), "prompts": lambda v, w: _int(v, w, 1, 10 ** 7),
             "tokens": lambda v, w: _int(v, w, 2, 10 ** 7), "positions": lambda v, w: _text(v, w),
             "corpus": _text_or_null, "seed": lambda v, w: _int(v, w, -MAX_INT, MAX_INT),
             "dtype": lambda v, w: _text(v, w), "device": lambda v, w: _text(v, w),
             "aggregation": lambda v, w: _text(v, w), "kl_dtype": lambda v, w: _text(v, w),
             "bos": lambda v, w: _text(v, w), "corpus_label": _text_or_null, "corpus_sha256": _text_or_null}
_CORPUS = {"name": _text_or_null, "label": _text_or_null, "sha256": _text_or_null,
           "words": lambda v, w: _int(v, w, 0, MAX_INT, null=True),
           "eval_region_words": lambda v, w: _int(v, w, 0, MAX_INT, null=True),
           "fallback": lambda v, w: _bool(v, w, null=True)}


# ============================================================================================ primitives
def _skip(v, where):
    return v


def _fields(x, where: str, spec: dict, required: tuple = (), extra: Callable | None = None) -> dict:
    """Check an object field by field: ``spec[key](value, path)`` for known keys, ``extra`` for the others
    (None: unknown keys are refused).  Returns the checked values."""
    x = _object(x, where)
    for key in required:
        if key not in x:
            raise _Invalid(f"{_at(where, key)} is missing")
    out = {}
    for key, v in x.items():
        check = spec.get(key, extra)
        if check is None:
            known = ", ".join(spec)
            raise _Invalid(f"{_at(where, key)} is not a known field (known: {_clip(known, 160)})")
        out[key] = check(v, _at(where, key))
    return out


def _object(x, where: str, hint: str = "") -> dict:
    if not isinstance(x, dict):
        _fail(where, x, "is not an object" + (f" {hint}" if hint else ""))
    for key in x:
        if not isinstance(key, str):
            _fail(where, key, "has a key that is not a string")
    return x


def _array(x, where: str, max_len: int, too_long: str | None = None) -> list | tuple:
    if not isinstance(x, (list, tuple)):
        _fail(where, x, "is not an array")
    if len(x) > max_len:
        _fail(where, x, too_long or f"has more than {max_len} items")
    return x


_PLAIN = {int, float}


def _plain_numbers(v: list, bound: float) -> bool:
    """The fast path (C loops): True when every item is a plain int/float with |x| <= bound and none is NaN.  False
    means "look closer": the caller then checks item by item and names the culprit (numpy scalars pass there)."""
    if not v:
        return True
    if not set(map(type, v)) <= _PLAIN or not (-bound <= min(v) and max(v) <= bound):
        return False
    total = sum(v)  # the items are bounded, so the sum is NaN exactly when one of them is
    return not math.isnan(total)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _int(x, where: str, lo: int, hi: int, null: bool = False) -> int | None:
    if x is None and null:
        return None
    if not _is_int(x):
        _fail(where, x, "is not an integer" + (" or null" if null else ""))
    if not lo <= x <= hi:
        _fail(where, x, f"is outside {lo}..{hi}")
    return int(x)


def _number(x, where: str, lo: float = -math.inf, hi: float = math.inf, null: bool = False) -> float | None:
    """A finite number in [lo, hi] (as float), or None when ``null``."""
    if x is None and null:
        return None
    if isinstance(x, NonFinite):
        _fail(where, x, "is not a finite number (JSON has no NaN or Infinity)")
    if not _is_number(x):
        _fail(where, x, "is not a number" + (" or null" if null else ""))
    if _is_int(x):
        if not lo <= x <= hi:
            _fail(where, x, f"is outside {lo:g}..{hi:g}")
        return float(x)
    if not math.isfinite(x):
        _fail(where, x, "is not a finite number")
    if not lo <= x <= hi:
        _fail(where, x, f"is outside {lo:g}..{hi:g}")
    return float(x)


def _text(x, where: str, choices: tuple | None = None, null: bool = False) -> str | None:
    if x is None and null:
        return None
    if not isinstance(x, str):
        _fail(where, x, "is not a string" + (" or null" if null else ""))
    if len(x) > MAX_STRING:
        _fail(where, x, f"is longer than {MAX_STRING} characters")
    if choices is not None and x not in choices:
        _fail(where, x, f"is not one of {', '.join(choices)}")
    return x


def _bool(x, where: str, null: bool = False) -> bool | None:
    if x is None and null:
        return None
    if not isinstance(x, bool):
        _fail(where, x, "is not true or false")
    return x


def _scalar(x, where: str):
    """A plain value: string, number, true/false or null."""
    if x is None or isinstance(x, bool):
        return x
    if isinstance(x, str):
        return _text(x, where)
    if _is_number(x) or isinstance(x, NonFinite):
        _number(x, where, -MAX_INT, MAX_INT)
        return x
    _fail(where, x, "is not a plain value (string, number, true/false or null)")


def _json(x, where: str):
    """Any JSON value nested at most MAX_DEPTH levels, with string keys, finite numbers and integers of at most
    64 bits (so that it can be written back and hashed).  Iterative: no recursion on hostile input."""
    stack = [(x, where, 1)]
    while stack:
        v, w, depth = stack.pop()
        if isinstance(v, dict):
            items = v.items()
        elif isinstance(v, (list, tuple)):
            items = enumerate(v)
        else:
            _leaf(v, w)
            continue
        if depth > MAX_DEPTH:
            _fail(w, v, f"is nested more than {MAX_DEPTH} levels deep")
        for k, c in items:
            if isinstance(v, dict) and not isinstance(k, str):
                _fail(w, k, "has a key that is not a string")
            if isinstance(c, (dict, list, tuple)):
                stack.append((c, _at(w, k), depth + 1))
            elif not (c is None or isinstance(c, (str, bool)) or type(c) is float and math.isfinite(c)):
                _leaf(c, _at(w, k))
    return x


def _leaf(v, where: str) -> None:
    if v is None or isinstance(v, (str, bool)):
        return
    if _is_number(v) or isinstance(v, NonFinite):
        _number(v, where, -MAX_INT, MAX_INT)
        return
    _fail(where, v, "is not a JSON value")


def _at(where: str, key) -> str:
    """The path of ``key`` below ``where``: ``a.b``, ``a[3]``, ``a["0,1"]``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    key = str(key)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]{0,63}", key):
        return f"{where}.{key}" if where else key
    return f"{where}[{_show(key)}]"


def _fail(where: str, value, problem: str):
    raise _Invalid(f"{where or 'the top level'} = {_show(value)} {problem}")


def _show(v) -> str:
    """A short readable rendering of a JSON value for a message (never huge, never raises)."""
    if v is None:
        return "null"
    if isinstance(v, NonFinite):
        return v.token
    if isinstance(v, bool):
        return "true" if v else "false"
    if _is_int(v):
        v = int(v)
        return str(v) if v.bit_length() <= 64 else f"a {int(v.bit_length() * 0.30103) + 1}-digit integer"
    if isinstance(v, (float, np.floating)):
        return "NaN" if math.isnan(v) else "Infinity" if v == math.inf else "-Infinity" if v == -math.inf \
            else repr(float(v))
    if isinstance(v, str):
        return json.dumps(_clip(v, 40))
    if isinstance(v, tuple) and len(v) <= 4 and all(_is_int(e) for e in v):
        return "(" + ", ".join(_show(e) for e in v) + ")"
    if isinstance(v, (list, tuple)) and len(v) <= 4 and all(
            e is None or isinstance(e, (bool, str, NonFinite)) or _is_number(e) for e in v):
        return "[" + ", ".join(_show(e) for e in v) + "]"
    if isinstance(v, (list, tuple)):
        return f"an array of {len(v)}"
    if isinstance(v, dict):
        return f"an object of {len(v)} keys"
    return f"a Python {type(v).__name__}"


def _clip(s: str, n: int) -> str:
    s = s.replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"
