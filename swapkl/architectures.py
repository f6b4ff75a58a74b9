"""The one table of supported model families.

Each family says, as data, where a Hugging Face causal LM keeps its decoder blocks, its final norm, its
output head and its embeddings, which attribute of a block holds the KV-cache index (``layer_idx``), and
which config entries are per-layer lists that must be cut when blocks are removed.  Nothing else in swapkl
dispatches on ``model_type``: code asks :func:`family_for` / :func:`locate` and gets modules back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from swapkl.errors import SwapklError


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
    notes: str = ""


FAMILIES: tuple[Family, ...] = (
    Family(
        name="llama",
        model_types=("llama", "mistral", "qwen2", "qwen3", "smollm3"),
        blocks="model.layers",
        final_norm="model.norm",
        embed="model.embed_tokens",
        layer_idx_attrs=("self_attn.layer_idx", "layer_idx"),
        notes="Llama / Mistral / Qwen2 / Qwen3 / SmolLM (SmolLM1-2 are Llama): pre-norm, rotary, RMSNorm.",
    ),
    Family(
        name="gpt_neox",
        model_types=("gpt_neox",),
        blocks="gpt_neox.layers",
        final_norm="gpt_neox.final_layer_norm",
        embed="gpt_neox.embed_in",
        layer_idx_attrs=("attention.layer_idx", "layer_idx"),
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
        notes="GPT-2: learned positions, LayerNorm; scale_attn_by_inverse_layer_idx follows the slot.",
    ),
)


def supported_model_types() -> list[str]:
    return sorted({t for f in FAMILIES for t in f.model_types})


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


def _set_path(root: object, path: str, value) -> None:
    parent_path, _, last = path.rpartition(".")
    parent = get_path(root, parent_path) if parent_path else root
    setattr(parent, last, value)


@dataclass
class Located:
    """The modules of one loaded model, found through its family."""

    family: Family
    blocks: torch.nn.ModuleList
    final_norm: torch.nn.Module
    head: torch.nn.Module

    @property
    def num_layers(self) -> int:
        return len(self.blocks)


def locate(model: torch.nn.Module) -> Located:
    """Find blocks, final norm and head of ``model`` and check they are what the table says."""
    mt = getattr(model.config, "model_type", "?")
    fam = family_for(mt)
    blocks = get_path(model, fam.blocks)
    norm = get_path(model, fam.final_norm)
    head = get_path(model, fam.head)
    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    if not isinstance(blocks, torch.nn.ModuleList) or norm is None or head is None:
        raise UnsupportedArchitecture(
            f"model_type {mt} loaded as {type(model).__name__}, whose modules do not match the '{fam.name}' "
            f"family ({fam.blocks}, {fam.final_norm}, {fam.head})"
        )
    n_cfg = num_layers_in_config(model.config, fam)
    if n_cfg is not None and n_cfg != len(blocks):
        raise UnsupportedArchitecture(
            f"{type(model).__name__}: config says {n_cfg} layers but {fam.blocks} holds {len(blocks)}"
        )
    return Located(fam, blocks, norm, head)


def num_layers_in_config(config, fam: Family) -> int | None:
    for key in fam.num_layers_keys:
        v = getattr(config, key, None)
        if isinstance(v, int):
            return v
    return None


def set_layer_index(block: torch.nn.Module, fam: Family, idx: int) -> None:
    """Set every ``layer_idx`` attribute the family lists on ``block`` (and its attention) to ``idx``."""
    for path in fam.layer_idx_attrs:
        parent_path, _, attr = path.rpartition(".")
        parent = get_path(block, parent_path) if parent_path else block
        if parent is not None and hasattr(parent, attr):
            setattr(parent, attr, idx)


def keep_layers_in_config(config, fam: Family, keep: Iterable[int]) -> None:
    """Rewrite ``config`` in place for a stack that keeps the blocks ``keep`` (old indices, in order)."""
    keep = list(keep)
    for key in fam.num_layers_keys:
        if isinstance(getattr(config, key, None), int):
            setattr(config, key, len(keep))
    for key in fam.per_layer_keys:
        v = getattr(config, key, None)
        if isinstance(v, (list, tuple)) and v:
            setattr(config, key, [v[k] for k in keep])
    # Qwen2-style: sliding window applied to layers >= max_window_layers. Keep each kept layer's old type
    # by materialising layer_types above (if present); max_window_layers is left as the library handles it.
