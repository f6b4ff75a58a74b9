"""Validation of result files that come from outside: browser uploads, ``--scores`` / ``--curves`` files, saved
results.  Such a file is hostile until checked: nothing is built from it (no matrix, no pair list, no array)
before the whole document has passed.

Three steps, each bounded in time and memory by the size of the input:

1. :func:`read_json_file` / :func:`parse_json`: at most ``max_bytes`` of UTF-8 text (64 MiB by default), nesting
   at most :data:`MAX_DEPTH` levels (checked on the raw text *before* Python's recursive JSON parser runs), and no
   ``NaN`` / ``Infinity`` tokens (Python's ``json`` accepts them by default; JSON does not).
2. :func:`result_fields` (a ``score --json`` result), :func:`curves_fields` (a ``curves --json`` file) and
   :func:`score_matrices` (plain ``{"replacement": L×L, "interchange": L×L}`` scores): every field has the right
   type, layer indices are in range, numbers are finite, sizes are bounded (see the constants below).
3. Only then the caller's object is built from the normalised fields this module returns.

Every problem is one :class:`~swapkl.errors.UploadError` whose message is one line naming the file and the field,
e.g. ``result file: pairs[3] = (-1, 2) is outside 0..4``.  This module is pure library (no Streamlit).
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
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


class _Invalid(Exception):
    """One problem at one field; :func:`_document` prefixes the file label and raises :class:`UploadError`."""


# ============================================================================================ raw text
def read_json_file(path: str | os.PathLike, what: str = "result file", max_bytes: int = MAX_BYTES,
                   keep_constants: bool = False) -> Any:
    """The parsed JSON of the file at ``path`` (at most ``max_bytes`` bytes are read), as :func:`parse_json`.
    ``what`` names the kind of file in messages (``no such scores file: ...``)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise UploadError(f"{what} {p}: {_mb(size)} is larger than the {_mb(max_bytes)} limit")
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise UploadError(f"no such {what}: {p}") from None
    except OSError as e:
        raise UploadError(f"cannot read {what} {p}: {e.strerror or e}") from None
    return parse_json(raw, f"{what} {p}", max_bytes, keep_constants=keep_constants)


def parse_json(raw: bytes | bytearray | str, what: str = "result file", max_bytes: int = MAX_BYTES,
               max_depth: int = MAX_DEPTH, keep_constants: bool = False) -> Any:
    """Parse JSON text safely: at most ``max_bytes`` (bytes, or characters for a ``str``), UTF-8, nesting at most
    ``max_depth`` levels (checked before parsing), no ``NaN``/``Infinity`` tokens.  Raises :class:`UploadError`.

    ``keep_constants``: parse such tokens as :class:`NonFinite` markers instead of refusing them, for a caller
    that validates the document next (the validators refuse a marker naming its field)."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        if len(raw) > max_bytes:
            raise UploadError(f"{what}: {_mb(len(raw))} is larger than the {_mb(max_bytes)} limit")
        try:
            text = bytes(raw).decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise UploadError(f"{what}: not a JSON file (not UTF-8 text at byte {e.start})") from None
    elif isinstance(raw, str):
        if len(raw) > max_bytes:
            raise UploadError(f"{what}: {_mb(len(raw))} is larger than the {_mb(max_bytes)} limit")
        text = raw.removeprefix("\ufeff")
    else:
        raise UploadError(f"{what}: not a JSON file (got a Python {type(raw).__name__})")
    depth = nesting_depth(text, stop_above=max_depth)
    if depth > max_depth:
        raise UploadError(f"{what}: nested more than {max_depth} levels deep (swapkl files use at most 7)")
    try:
        return json.loads(text, parse_constant=NonFinite if keep_constants else _reject_constant)
    except _Invalid as e:
        raise UploadError(f"{what}: {e}") from None
    except json.JSONDecodeError as e:
        raise UploadError(f"{what}: not a JSON file ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:  # belt and braces: the depth check above should make this unreachable
        raise UploadError(f"{what}: nested too deeply to parse") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise UploadError(f"{what}: not a JSON file ({_clip(str(e), 120)})") from None


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_CHUNK = 1 << 16  # brackets per numpy step (256 KiB of int32 running depth)


def nesting_depth(text: str, stop_above: int | None = None) -> int:
    """The deepest nesting of ``[``/``{`` in JSON ``text`` (brackets inside strings do not count), in linear time
    and without recursion.  With ``stop_above`` the scan may stop as soon as the depth exceeds it."""
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii")
    b = np.frombuffer(skeleton, dtype=np.uint8)
    depth, deepest = 0, 0
    for k in range(0, len(b), _DEPTH_CHUNK):
        c = b[k:k + _DEPTH_CHUNK]
        steps = ((c == ord("[")) | (c == ord("{"))).view(np.int8) * np.int8(2) - np.int8(1)  # +1 open, -1 close
        run = depth + np.cumsum(steps, dtype=np.int32)
        deepest, depth = max(deepest, int(run.max())), int(run[-1])
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


class NonFinite:
    """A ``NaN``/``Infinity``/``-Infinity`` token read by ``parse_json(..., keep_constants=True)``: no number, so
    every validator refuses it, naming the field."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token

    def __repr__(self) -> str:
        return self.token


def _reject_constant(token: str):
    raise _Invalid(f"{token} is not a JSON number (write null for a value that is missing)")


def _mb(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB" if n >= 2 ** 20 else f"{n} bytes"


# ============================================================================================ documents
@contextmanager
def _document(what: str):
    """Turn the first field problem into ``UploadError("<what>: <problem>")``."""
    try:
        yield
    except _Invalid as e:
        raise UploadError(f"{what}: {e}") from None


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
        }
        f = _fields(d, "", spec, extra=_json)
    return {"num_layers": L, "pairs": pairs,
            "per_prompt": {name: {k: np.asarray(v, dtype=float) for k, v in vecs.items()}
                           for name, vecs in per_prompt.items()},
            "contract": f["contract"], "identity": f.get("model", {}),
            "prompt_token_ids": f.get("prompt_token_ids", []), "prompts_info": f.get("prompts", {}),
            "noise_floor": f.get("noise_floor"), "meta": f.get("meta", {})}


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
        }
        f = _fields(d, "", spec, extra=_json)
    out = {"model": model, "corpus": {}, "selection": {}, "baseline_ppl_ci": [], "baseline": {}}
    out.update((k, v) for k, v in f.items() if k in spec and spec[k] is not _skip)
    return out


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


# ============================================================================================ curves parts
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
    """The regime verdict of :func:`swapkl.removal.verdict.regime_verdict` with its full evidence (the dashboard shows
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
