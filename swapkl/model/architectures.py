"""Where a loaded model keeps its modules, and the config edits that follow them.

:func:`locate` finds blocks, final norm, head and output function through a user's family validated on the model
(:mod:`swapkl.model.user_family`), the family table (:mod:`swapkl.model.families`) or, for a model type not in it, the validated generic fallback
(:mod:`swapkl.model.discovery`).  The config helpers here read the context length, cut the per-layer lists of a
shortened stack and renumber the KV-cache index of a block.  Nothing else in swapkl dispatches on ``model_type``.
"""
from __future__ import annotations

import functools
import inspect

import torch

from swapkl.errors import ContractError
from swapkl.model.block_io import call_args
from swapkl.model.discovery import GENERIC_CONTEXT_KEYS, found_family, generic_family, registered_family
from swapkl.model.families import (FAMILIES, Family, Located, UnsupportedArchitecture, family_for,  # noqa: F401
                                   get_path, known_family, locate_with, num_layers_in_config, supported_model_types)


def locate(model: torch.nn.Module) -> Located:
    """Find blocks, final norm, head and output function of ``model``: through the user's family registered for it
    (:mod:`swapkl.model.user_family`), else the table for a listed ``model_type``, else the validated generic
    fallback (:func:`generic_family`)."""
    mt = getattr(model.config, "model_type", "?")
    fam = registered_family(model) or known_family(mt) or generic_family(model)
    return locate_with(model, fam)


@torch.inference_mode()
def block_call_args(model: torch.nn.Module, tokens: int) -> tuple[tuple, dict]:
    """The arguments after the hidden states (rotary ``position_embeddings``, masks, ``position_ids``, ...) that
    ``model``'s forward passes its first block for a batch of one window of ``tokens`` tokens, with
    ``use_cache=False``: what a block needs to be run alone."""
    loc = locate(model)
    V = int(getattr(model.config, "vocab_size", 0) or loc.head.weight.shape[0])
    dev = next(model.parameters()).device
    ids = torch.randint(0, V, (1, tokens), generator=torch.Generator().manual_seed(0)).to(dev)
    got: list = []

    def pre(mod, args, kwargs):
        got.append(call_args(args, kwargs))
        raise _Captured

    handle = loc.blocks[0].register_forward_pre_hook(pre, with_kwargs=True)
    try:
        model(input_ids=ids, use_cache=False)
    except _Captured:
        pass
    finally:
        handle.remove()
    return got[0]


class _Captured(Exception):
    """Stops a forward once the first block's arguments are captured."""


def context_length(config, fam: Family | None = None) -> tuple[int, str] | None:
    """``(tokens, config key)``: how many positions the model takes (its family's :attr:`Family.context_keys`,
    else the generic spellings), or None when the config names none."""
    keys = fam.context_keys if fam is not None else GENERIC_CONTEXT_KEYS
    for key in (*keys, *GENERIC_CONTEXT_KEYS):
        v = getattr(config, key, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v, key
    return None


def check_context(model: torch.nn.Module, n_tokens: int, what: str, advice: str, name: str | None = None) -> None:
    """Raise :class:`~swapkl.errors.ContractError` when ``n_tokens`` (tokens fed in one forward pass) exceeds
    the model's context (:func:`context_length`); ``what`` names the setting ("--tokens 4096"), ``advice`` says
    what to do (``{limit}`` becomes the context length).  A config without a context length passes."""

    mt = getattr(model.config, "model_type", "?")
    ctx = context_length(model.config, registered_family(model) or known_family(mt) or found_family(model))
    if ctx is None or n_tokens <= ctx[0]:
        return
    who = name or getattr(model, "name_or_path", None) or mt
    raise ContractError(f"{what} is more than the model's context: {who} has {ctx[0]} positions ({ctx[1]} in its "
                        f"config); {advice.format(limit=ctx[0])}")


def set_layer_index(block: torch.nn.Module, fam: Family, idx: int) -> None:
    """Set every ``layer_idx`` attribute the family lists on ``block`` (and its attention) to ``idx``."""
    for path in fam.layer_idx_attrs:
        parent_path, _, attr = path.rpartition(".")
        parent = get_path(block, parent_path) if parent_path else block
        if parent is not None and hasattr(parent, attr):
            setattr(parent, attr, idx)


def cached_forward(model: torch.nn.Module, input_ids: torch.Tensor, cache=None, **kw):
    """``model(input_ids, use_cache=True)`` continuing from ``cache`` (None: a fresh one), under the keyword this
    ``transformers`` names it (``cache`` in newer releases such as 5.24, ``past_key_values`` in older ones such as
    the GPU image's 5.17; the old name is deprecated, to go in 5.40, so the signature decides).
    Returns ``(output, its cache)``."""
    name = "cache" if "cache" in _forward_params(type(model)) else "past_key_values"
    out = model(input_ids=input_ids, use_cache=True, **({name: cache} if cache is not None else {}), **kw)
    new = getattr(out, "cache", None)
    return out, (new if new is not None else out.past_key_values)


@functools.cache
def _forward_params(cls) -> frozenset:
    """The keyword names of ``cls.forward`` (once per class)."""
    return frozenset(inspect.signature(cls.forward).parameters)
