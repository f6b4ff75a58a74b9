"""The one table of supported model families (``data/families.json``, read through :mod:`swapkl.model.knowledge`),
and where a loaded model keeps its modules.

Each family says, as data, where a Hugging Face causal LM keeps its decoder blocks, its final norm, its
output head and its embeddings, which attribute of a block holds the KV-cache index (``layer_idx``), which
config entries are per-layer lists that must be cut when blocks are removed, and how the logits follow from the
last block's output (:mod:`swapkl.model.outputs`).  Nothing else in swapkl dispatches on ``model_type``: code asks
:func:`swapkl.model.architectures.locate` and gets modules back.  A model type that is not in the table is found
and validated by :mod:`swapkl.model.discovery`; a user's description of a family (:func:`family_from`, the same
schema as a ``families.json`` entry) is accepted by :mod:`swapkl.model.user_family` once it validates on the model.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import torch

from swapkl.errors import SwapklError
from swapkl.model import knowledge
from swapkl.model.knowledge import KnowledgeError
from swapkl.model.outputs import OUTPUTS
from swapkl.model.projections import LINEAR_LAYOUT, WEIGHT_LAYOUTS


class UnsupportedArchitecture(SwapklError):
    """Raised for a ``model_type`` that is not in :data:`FAMILIES`."""


@dataclass(frozen=True)
class Family:
    """Module paths of one family, relative to the ``*ForCausalLM`` object (dotted attribute paths)."""

    name: str
    model_types: tuple[str, ...]
    blocks: str
    final_norm: str
    head: str = "lm_head"
    embed: str = ""
    layer_idx_attrs: tuple[str, ...] = ()
    # config keys that count layers (all are set to the new count after removal)
    num_layers_keys: tuple[str, ...] = ("num_hidden_layers",)
    # config keys holding one entry per layer (cut in step with the blocks)
    per_layer_keys: tuple[str, ...] = ("layer_types",)
    # config keys holding the context length in tokens (the first integer one counts; rotary models too)
    context_keys: tuple[str, ...] = ("max_position_embeddings",)
    notes: str = ""
    generic: bool = False  # found by the validated fallback, not listed in FAMILIES
    # the sublayer layout (a key of swapkl.model.units.LAYOUTS): where attention and MLP units live in a block;
    # None for a listed family = no sublayer units; a generic family tries every layout (validated on the model)
    units: str | None = None
    # the linear bridge's fold (docs/repair.md): the MLP output projection inside a block ("" = no exact fold known),
    # its weight layout ("linear": [out, in], y = x Wᵀ + b; "conv1d": [in, out], y = x W + b), and a norm applied after
    # it before the residual add (Gemma's sandwich norm: "" = none), which makes the fold inexact
    mlp_out: str = ""
    mlp_out_layout: str = "linear"
    post_mlp_norm: str = ""
    # the output function (a key of swapkl.model.outputs.OUTPUTS): "head" = final norm + head, "tail" = the model's own
    # forward after its last block (soft-capping, scaling, extra heads); final_norm may be "" for a "tail" family
    output: str = "head"
    # what a block returns: 0 = the hidden states alone, k = a tuple of k items led by them (the "tail" stand-ins)
    block_tuple: int = 0
    # what the output function reads after the last block (swapkl.model.handed.JOINS): "" its hidden states, or those
    # and the states it hands on joined along the width (Reformer's two reversible streams: "handed-first")
    state_join: str = ""


#: the field types a family description may give (the annotations of :class:`Family`)
_KINDS = {"str": str, "tuple[str, ...]": tuple, "bool": bool, "int": int, "str | None": (str, type(None))}
#: the fields a family description must give
REQUIRED = ("name", "model_types", "blocks", "final_norm")


def family_from(data: Mapping, where: str) -> Family:
    """A :class:`Family` from its description ``data`` (a JSON object: the fields of :class:`Family`, lists for its
    tuples; a field left out takes its default).  ``where`` names the source in errors (``"families.json: llama"``).
    Raises :class:`~swapkl.model.knowledge.KnowledgeError` in one line naming the key for a missing required key, an
    unknown key or a value of the wrong type."""
    if not isinstance(data, Mapping):
        raise KnowledgeError(f"{where}: a family is a JSON object, not {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Family)}
    kw: dict = {}
    for key, value in data.items():
        if key not in fields:
            raise KnowledgeError(f"{where}: unknown key '{key}' (known: {', '.join(fields)})")
        kind = _KINDS[str(fields[key].type)]
        if kind is tuple:
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
                raise KnowledgeError(f"{where}: key '{key}' must be a list of non-empty strings")
            value = tuple(value)
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise KnowledgeError(f"{where}: key '{key}' must be {fields[key].type}, not {type(value).__name__}")
        kw[key] = value
    missing = [k for k in REQUIRED if k not in kw]
    if missing:
        raise KnowledgeError(f"{where}: key '{missing[0]}' is missing")
    if kw.get("mlp_out_layout", LINEAR_LAYOUT) not in WEIGHT_LAYOUTS:
        raise KnowledgeError(f"{where}: key 'mlp_out_layout' must be one of {', '.join(WEIGHT_LAYOUTS)}")
    if kw.get("output", "head") not in OUTPUTS:
        raise KnowledgeError(f"{where}: key 'output' must be one of {', '.join(OUTPUTS)}, not {kw['output']!r}")
    return Family(**kw)


def _listed() -> tuple[Family, ...]:
    """The families of ``data/families.json``, in order."""
    listed = knowledge.entry("families", "families")
    if not isinstance(listed, tuple):
        raise KnowledgeError("families.json: key 'families' must be a list")
    return tuple(family_from(d, f"families.json: families[{k}]") for k, d in enumerate(listed))


#: the listed families (``data/families.json``): nothing else in swapkl dispatches on ``model_type``
FAMILIES: tuple[Family, ...] = _listed()


def supported_model_types() -> list[str]:
    return sorted({t for f in FAMILIES for t in f.model_types})


def known_family(model_type: str) -> Family | None:
    """The table's family for ``model_type``, or None."""
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    return None


def family_for(model_type: str) -> Family:
    """The family of a config's ``model_type``; raises :class:`UnsupportedArchitecture` with the list."""
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    raise UnsupportedArchitecture(
        f"unsupported architecture: {model_type}; supported: {', '.join(supported_model_types())}"
    )


def get_path(root: object, path: str):
    """Follow a dotted attribute path (``"model.layers"``); returns None where it is absent."""
    obj = root
    for part in path.split("."):
        if not part:
            continue
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@dataclass
class Located:
    """The modules of one loaded model, found through its family.  ``final_norm`` is None for a family whose output
    function is the model's own tail (``Family.output == "tail"``) without a norm module of its own."""

    family: Family
    blocks: torch.nn.ModuleList
    final_norm: torch.nn.Module | None
    head: torch.nn.Module
    model: torch.nn.Module | None = None

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def block_output(self) -> int:
        return self.family.block_tuple

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """The model's logits [..., T, V] of last-block outputs ``h_last`` [..., T, D] (its output function,
        :mod:`swapkl.model.outputs`)."""
        return OUTPUTS[self.family.output].logits(self.model, self, h_last)


def locate_with(model: torch.nn.Module, fam: Family) -> Located:
    """The modules of ``model`` where ``fam`` says they are; raises :class:`UnsupportedArchitecture` when they are
    not there (or the config's layer count differs from the block list's length)."""
    mt = getattr(model.config, "model_type", "?")
    blocks = get_path(model, fam.blocks)
    norm = get_path(model, fam.final_norm)
    head = get_path(model, fam.head)
    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    if not isinstance(blocks, torch.nn.ModuleList) or head is None or (
            not isinstance(norm, torch.nn.Module) and (fam.final_norm or fam.output == "head")):
        raise UnsupportedArchitecture(
            f"model_type {mt} loaded as {type(model).__name__}, whose modules do not match the '{fam.name}' "
            f"family ({fam.blocks}, {fam.final_norm}, {fam.head})"
        )
    n_cfg = num_layers_in_config(model.config, fam)
    if n_cfg is not None and n_cfg != len(blocks):
        raise UnsupportedArchitecture(
            f"{type(model).__name__}: config says {n_cfg} layers but {fam.blocks} holds {len(blocks)}"
        )
    return Located(fam, blocks, norm if isinstance(norm, torch.nn.Module) else None, head, model)


def num_layers_in_config(config, fam: Family) -> int | None:
    for key in fam.num_layers_keys:
        v = getattr(config, key, None)
        if isinstance(v, int):
            return v
    return None
