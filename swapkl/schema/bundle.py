"""Validation of a demo bundle (``swapkl bundle``, :mod:`swapkl.compare.bundle`) that comes from outside: one JSON
document holding every finished result of one analysis.  The envelope is checked here (format tag, where it was
computed, the model and the contract, only known parts); each part by the validator of its own type (a score result,
curves, task accuracy; evidence and healed curves as bounded plain JSON here, then by their own ``from_dict``).
Nothing is built before the whole document has passed; a bundle is data only (JSON, no code, no pickles)."""
from __future__ import annotations

from typing import Any

from swapkl.schema.curves import curves_fields
from swapkl.schema.fields import _document, _fail, _fields, _json, _object, _scalar, _text, contract, identity
from swapkl.schema.result import result_fields
from swapkl.schema.tasks import tasks_fields

BUNDLE_FORMAT = "swapkl.bundle/1"
#: the parts a bundle may hold (``scores`` is required: every page starts from it)
PARTS = ("scores", "curves", "evidence", "tasks", "heal")


def _part(name: str, x, where: str):
    if name == "scores":
        result_fields(x, where)
    elif name == "curves":
        curves_fields(x, where)
    elif name == "tasks":
        tasks_fields(x, where)
    else:  # evidence, heal: plain bounded JSON objects here; their own from_dict checks the rest
        _json(_object(x, where), where)
    return x


def bundle_fields(d: Any, what: str = "bundle") -> dict:
    """``{"computed_on", "model", "contract", "parts"}`` of a bundle dict, validated; one-line
    :class:`~swapkl.errors.UploadError` naming ``what`` and the field otherwise."""
    with _document(what):
        d = _object(d, "", "(a 'swapkl bundle' file)")
        if d.get("format") != BUNDLE_FORMAT:
            _fail("format", d.get("format"), f"is not {BUNDLE_FORMAT!r} (not a swapkl bundle)")

        def parts(v, w):
            v = _object(v, w)
            if "scores" not in v:
                _fail(w, v, "has no 'scores' part")
            for name in v:
                if name not in PARTS:
                    _fail(w, name, f"is not a bundle part ({', '.join(PARTS)})")
            return v

        f = _fields(d, "", {"format": _text, "swapkl_version": _text, "model": identity, "contract": contract,
                            "computed_on": lambda v, w: _fields(v, w, {}, extra=_scalar), "parts": parts,
                            "notes": _json}, required=("computed_on", "model", "contract", "parts"))
    for name, x in f["parts"].items():
        _part(name, x, f"{what}: part {name}")
    return {k: f[k] for k in ("computed_on", "model", "contract", "parts")}
