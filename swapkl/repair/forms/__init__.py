"""The bridge forms, one file each, found by this registry (docs/repair.md "Forms"; the removal methods' registry is
the model).  Every module of this package but ``base`` that defines ``FORM`` (a :class:`~.base.BridgeForm`) is a
form; adding a form is adding its file.  Every ``--form`` choice (:data:`NAMES`), the one validation message
(:func:`get`), the fallback of a span where the asked form does not apply (:func:`resolve`) and the docs table
(:func:`table`) come from here.  No torch at import."""
from __future__ import annotations

import importlib
import pkgutil

from swapkl.errors import ContractError
from swapkl.repair.forms.base import BridgeForm, NoExactFold


def _discover() -> dict[str, BridgeForm]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        form = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FORM", None)
        if isinstance(form, BridgeForm):
            found.append(form)
    return {f.name: f for f in sorted(found, key=lambda f: (f.order, f.name))}


#: ``{name: form}`` in choice order
REGISTRY: dict[str, BridgeForm] = _discover()
#: the ``--form`` choices, the default first
NAMES: tuple[str, ...] = tuple(REGISTRY)
DEFAULT: str = NAMES[0]


def get(name) -> BridgeForm:
    """The form called ``name``; one line naming the choices otherwise."""
    form = REGISTRY.get(name) if isinstance(name, str) else None
    if form is None:
        raise ContractError(f"unknown bridge form '{name}'; choose one of: {', '.join(NAMES)}")
    return form


def resolve(model, spans, asked: str) -> dict:
    """``{span: (form used, why it differs from ``asked`` or None)}``: a span where the asked form does not apply
    (:class:`NoExactFold`) uses the form's fallback, with the first clause of the reason."""
    form = get(asked)
    out = {}
    for i, j in spans:
        try:
            form.check(model, i)
            out[(i, j)] = (form.name, None)
        except NoExactFold as e:
            if form.fallback is None:
                raise
            out[(i, j)] = (form.fallback, str(e).split(";")[0])
    return out


def table() -> str:
    """The forms as a Markdown table (name, what it is, whether it exports): docs/repair.md holds it."""
    rows = ["| form | what it is | exports |", "|---|---|---|"]
    rows += [f"| `{f.name}` | {f.description} | {'yes' if f.exports else 'no'} |" for f in REGISTRY.values()]
    return "\n".join(rows)


__all__ = ["BridgeForm", "DEFAULT", "NAMES", "NoExactFold", "REGISTRY", "get", "resolve", "table"]
