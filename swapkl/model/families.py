"""The one table of supported model families, and where a loaded model keeps its modules.

Each family says, as data, where a Hugging Face causal LM keeps its decoder blocks, its final norm, its
output head and its embeddings, which attribute of a block holds the KV-cache index (``layer_idx``), which
config entries are per-layer lists that must be cut when blocks are removed, and how the logits follow from the
last block's output (:mod:`swapkl.model.outputs`).  Nothing else in swapkl dispatches on ``model_type``: code asks
:func:`swapkl.model.architectures.locate` and gets modules back.  A model type that is not in the table is found
and validated by :mod:`swapkl.model.discovery`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from swapkl.errors import SwapklError
from swapkl.model.outputs import OUTPUTS


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


FAMILIES: tuple[Family, ...] = (
    Family(
        name="llama",
        model_types=("llama", "mistral", "qwen2", "qwen3", "smollm3"),
        blocks="model.layers",
        final_norm="model.norm",
        embed="model.embed_tokens",
        layer_idx_attrs=("self_attn.layer_idx", "layer_idx"),
        units="pre-norm", mlp_out="mlp.down_proj",
        notes="Llama / Mistral / Qwen2 / Qwen3 / SmolLM (SmolLM1-2 are Llama): pre-norm, rotary, RMSNorm.",
    ),
    Family(
        name="gpt_neox",
        model_types=("gpt_neox",),
        blocks="gpt_neox.layers",
        final_norm="gpt_neox.final_layer_norm",
        embed="gpt_neox.embed_in",
        layer_idx_attrs=("attention.layer_idx", "layer_idx"),
        units="gpt-neox", mlp_out="mlp.dense_4h_to_h",
        notes="GPT-NeoX / Pythia: parallel residual, partial rotary.",
    ),
    Family(
        name="gpt2",
        model_types=("gpt2",),
        blocks="transformer.h",
        final_norm="transformer.ln_f",
        embed="transformer.wte",
        layer_idx_attrs=("attn.layer_idx", "layer_idx"),
        num_layers_keys=("n_layer", "num_hidden_layers"),
        context_keys=("n_positions", "n_ctx", "max_position_embeddings"),
        units="gpt2", mlp_out="mlp.c_proj", mlp_out_layout="conv1d",
        notes="GPT-2: learned positions, LayerNorm; scale_attn_by_inverse_layer_idx follows the slot.",
    ),
)


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
