"""A user's description of a family: a small JSON or YAML file, accepted for one loaded model only when the checks of
the generic fallback pass on it.

The file is one object with the fields of :class:`~swapkl.model.families.Family` (the schema of a
``data/families.json`` entry), where only ``blocks`` and ``final_norm`` are required::

    {"blocks": "model.layers", "final_norm": "model.norm", "head": "lm_head", "embed": "model.embed_tokens",
     "layer_idx_attrs": ["self_attn.layer_idx"], "num_layers_keys": ["num_hidden_layers"],
     "context_keys": ["max_position_embeddings"], "units": "pre-norm", "mlp_out": "mlp.down_proj"}

``units`` names a layout of ``data/layouts.json`` or gives one inline (``{"attention": {"modules": [...], "out":
[...], "core": "..."}, "mlp": {...}}``); ``name`` defaults to ``"user"``, ``model_types`` to the model's own type.
An unknown key or a value of the wrong type is refused in one line naming the key
(:class:`~swapkl.model.knowledge.KnowledgeError`).

:func:`register_family` checks the description on the loaded model with the generic fallback's own validation
(:func:`swapkl.model.discovery._validate`: every block called once per forward, in order; replaying the blocks slot
by slot reproduces the forward; the stated output function - the final norm and the head, or the model's own tail
- reproduces the logits; ``mlp_out`` folds exactly) and a layout with :func:`swapkl.model.units.validate_layout`;
then :func:`swapkl.model.architectures.locate` uses it for that model object.  Anything else is refused in one line
(:class:`~swapkl.model.families.UnsupportedArchitecture`).  Only the CLI (``--family FILE``) and the library take a
family file; the dashboard never does.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from swapkl.model import discovery, units
from swapkl.model.families import Family, UnsupportedArchitecture, family_from, get_path
from swapkl.model.knowledge import KnowledgeError
from swapkl.model.layouts import LAYOUTS, UnitLayout, layout_from

#: the largest family file read, in bytes (a description is a few hundred)
MAX_BYTES = 64_000


@dataclass(frozen=True)
class Description:
    """A parsed family description: the family (``units`` a layout name, or None) and its layout (None: none)."""

    family: Family
    layout: UnitLayout | None
    source: str
    given: frozenset = frozenset()  # the keys the description states


def read_description(path: str | os.PathLike) -> Description:
    """The description in the JSON or YAML file ``path`` (``.yaml``/``.yml``: YAML, else JSON); raises
    :class:`~swapkl.model.knowledge.KnowledgeError` in one line naming the file (and the key) when it cannot be read
    or is malformed."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_BYTES:
            raise KnowledgeError(f"{p.name}: a family file is at most {MAX_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KnowledgeError(f"{p.name}: cannot be read ({type(e).__name__})") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise KnowledgeError(f"{p.name}: not YAML ({' '.join(str(e).split())[:160]})") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise KnowledgeError(f"{p.name}: not JSON ({str(e).splitlines()[0]})") from None
    return parse_description(data, p.name)


def parse_description(data, source: str = "family") -> Description:
    """A :class:`Description` from a parsed description ``data`` (see the module docstring); ``source`` names it
    in errors."""
    if not isinstance(data, dict):
        raise KnowledgeError(f"{source}: a family description is an object, not {type(data).__name__}")
    data, given = dict(data), frozenset(data)
    if data.get("generic") is not None:
        raise KnowledgeError(f"{source}: key 'generic' is swapkl's own (the fallback's families), not a description's")
    unit = data.pop("units", None)
    layout = None
    if isinstance(unit, dict):
        layout = layout_from("user", unit, f"{source}: units")
    elif isinstance(unit, str):
        if unit not in LAYOUTS:
            raise KnowledgeError(f"{source}: key 'units' must name one of {', '.join(LAYOUTS)} or give a layout")
        layout = LAYOUTS[unit]
    elif unit is not None:
        raise KnowledgeError(f"{source}: key 'units' must be a layout name or an object, not {type(unit).__name__}")
    data.setdefault("name", "user")
    data.setdefault("model_types", [])
    fam = family_from(data, source)
    return Description(replace(fam, units=unit if isinstance(unit, str) else None), layout, source, given)


def register_family(model: torch.nn.Module, description: Description | str | os.PathLike) -> Family:
    """Check ``description`` (a :class:`Description`, or the path of a family file) on ``model`` and make it the
    family :func:`~swapkl.model.architectures.locate` finds for that model object; returns the family as
    validated (its output tuple, handed-on state and MLP output layout measured).  Raises
    :class:`~swapkl.model.families.UnsupportedArchitecture` in one line when it does not describe the model."""
    desc = description if isinstance(description, Description) else read_description(description)
    fam = validated(model, desc)
    discovery.remember_user_family(model, fam)
    units.adopt_layout(model, desc.layout)
    return fam


def validated(model: torch.nn.Module, desc: Description) -> Family:
    """The description's family, checked on ``model`` (see the module docstring); raises
    :class:`~swapkl.model.families.UnsupportedArchitecture` with the reason in one line."""
    mt = getattr(model.config, "model_type", "?")
    fam = desc.family if desc.family.model_types else replace(desc.family, model_types=(mt,))
    head = f"the family in {desc.source} does not describe {type(model).__name__} ({mt}): "
    stated_layout = fam.mlp_out_layout
    got, why = discovery._validate(model, fam, [fam.final_norm], (fam.output,), (fam.mlp_out,) if fam.mlp_out else ())
    if got is None:
        raise UnsupportedArchitecture(head + why)
    if fam.mlp_out and not got.mlp_out:
        raise UnsupportedArchitecture(head + f"mlp_out {fam.mlp_out}: doubling it does not add its output to the "
                                             "block's once more (a norm after it, or not the MLP's output)")
    if "mlp_out_layout" in desc.given and got.mlp_out_layout != stated_layout:
        raise UnsupportedArchitecture(head + f"mlp_out_layout: {fam.mlp_out} is {got.mlp_out_layout}, not {stated_layout}")
    if fam.embed and not isinstance(get_path(model, fam.embed), torch.nn.Module):
        raise UnsupportedArchitecture(head + f"embed: the model has no module {fam.embed}")
    if desc.layout is not None:
        why = units.validate_layout(model, get_path(model, fam.blocks), desc.layout)
        if why is not None:
            raise UnsupportedArchitecture(head + f"units: {why}")
    return got

