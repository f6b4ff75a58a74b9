"""Raw text: at most ``max_bytes`` of UTF-8, nesting bounded on the raw text before Python's recursive parser runs,
no ``NaN`` / ``Infinity`` tokens; and :func:`plain_text`, a string from a file with its markup removed before a
figure draws it."""
from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from swapkl.errors import UploadError

from swapkl.schema.fields import _clip, _Invalid, MAX_BYTES, MAX_DEPTH, NonFinite


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


_TAG = re.compile(r"<[^<>]*>")
_BREAK = re.compile(r"<\s*br\s*/?\s*>", re.IGNORECASE)
_SPACE = re.compile(r"\s+")


def plain_text(x) -> str:
    """``x`` as plain text for a figure or a report: character references decoded, every tag removed (again until
    none is left: ``<<b>a href=...>`` leaves no tag behind), a stray ``<`` / ``>`` dropped, white space (line
    breaks included) as single blanks.  Plotly draws a subset of HTML in titles, axis and legend labels and hover
    text (``<a href>``, ``<b>``, ``<br>``, ``<span style>``): a label from a study file or a visitor's text would
    otherwise put a clickable link, or a restyled line, into a figure and its HTML report."""
    s = str(x)
    while True:
        t = _TAG.sub("", _BREAK.sub(" ", html.unescape(s)))
        if t == s:
            break
        s = t
    return _SPACE.sub(" ", s.replace("<", "").replace(">", "")).strip()


def _reject_constant(token: str):
    raise _Invalid(f"{token} is not a JSON number (write null for a value that is missing)")


def _mb(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB" if n >= 2 ** 20 else f"{n} bytes"
