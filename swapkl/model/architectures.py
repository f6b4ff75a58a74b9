"""The one table of supported model families.

Each family says, as data, where a Hugging Face causal LM keeps its decoder blocks, its final norm, its
output head and its embeddings, which attribute of a block holds the KV-cache index (``layer_idx``), and
which config entries are per-layer lists that must be cut when blocks are removed.  Nothing else in swapkl
dispatches on ``model_type``: code asks :func:`family_for` / :func:`locate` and gets modules back.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Iterable

import weakref

import torch

from swapkl.errors import ContractError, SwapklError


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


# The validated generic fallback (as nnterp's default family): common spellings of the block list and the final
# norm; a candidate is used only if the model's own forward is reproduced (see _validate).
GENERIC_BLOCK_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "transformer.layers",
                       "transformer.blocks", "gpt_neox.layers", "model.transformer.h")
GENERIC_NORM_NAMES = ("norm", "final_layer_norm", "ln_f", "final_layernorm", "norm_f", "final_norm")
GENERIC_LAYER_IDX = ("self_attn.layer_idx", "attn.layer_idx", "attention.layer_idx", "self_attention.layer_idx",
                     "layer_idx")
GENERIC_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
GENERIC_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")
# config entries that change the logits after the output head (soft-capping, scaling): such models fail the fallback
LOGIT_MODIFIERS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale",
                   "logit_softcapping")


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
    """The modules of one loaded model, found through its family."""

    family: Family
    blocks: torch.nn.ModuleList
    final_norm: torch.nn.Module
    head: torch.nn.Module

    @property
    def num_layers(self) -> int:
        return len(self.blocks)


def locate(model: torch.nn.Module) -> Located:
    """Find blocks, final norm and head of ``model``: through the table for a listed ``model_type``, else
    through the validated generic fallback (:func:`generic_family`)."""
    mt = getattr(model.config, "model_type", "?")
    fam = known_family(mt) or generic_family(model)
    return _locate_with(model, fam)


def _locate_with(model: torch.nn.Module, fam: Family) -> Located:
    mt = getattr(model.config, "model_type", "?")
    blocks = get_path(model, fam.blocks)
    norm = get_path(model, fam.final_norm)
    head = get_path(model, fam.head)
    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    if not isinstance(blocks, torch.nn.ModuleList) or not isinstance(norm, torch.nn.Module) or head is None:
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


_GENERIC: weakref.WeakKeyDictionary[torch.nn.Module, Family] = weakref.WeakKeyDictionary()


def generic_family(model: torch.nn.Module) -> Family:
    """A :class:`Family` for a model whose ``model_type`` is not in the table, found by trying the common
    spellings of the block list and final norm, and **validated** on the model itself: on a short random input
    (``use_cache=False``) the final norm + output head applied to the last block's output must reproduce the
    model's logits, and replaying the blocks one slot at a time with the arguments the model passed them must
    reproduce that output.  Raises :class:`UnsupportedArchitecture` (the usual message plus why the fallback
    failed) when no candidate validates.  Memoised per model object."""
    if model in _GENERIC:
        return _GENERIC[model]
    mt = getattr(model.config, "model_type", "?")
    n = next((getattr(model.config, k) for k in GENERIC_LAYER_KEYS
              if isinstance(getattr(model.config, k, None), int)), None)
    reasons = []
    modifiers = [k for k in LOGIT_MODIFIERS if getattr(model.config, k, None) not in (None, 1, 1.0, False)]
    for path in GENERIC_BLOCK_PATHS if not modifiers else ():
        blocks = get_path(model, path)
        if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0 or (n is not None and len(blocks) != n):
            continue
        parent = path.rsplit(".", 1)[0]
        for name in GENERIC_NORM_NAMES:
            if not isinstance(get_path(model, f"{parent}.{name}"), torch.nn.Module):
                continue
            fam = Family(name=f"generic:{mt}", model_types=(mt,), blocks=path, final_norm=f"{parent}.{name}",
                         layer_idx_attrs=GENERIC_LAYER_IDX, num_layers_keys=GENERIC_LAYER_KEYS,
                         context_keys=GENERIC_CONTEXT_KEYS, generic=True,
                         notes="found and validated by the generic fallback")
            why = _validate(model, fam)
            if why is None:
                _GENERIC[model] = fam
                return fam
            reasons.append(f"{path} + {name}: {why}")
    modifiers = [k for k in LOGIT_MODIFIERS if getattr(model.config, k, None) not in (None, 1, 1.0, False)]
    if modifiers:  # the engine's logits are head(final_norm(h)): a model that changes them after the head is out
        reasons = [f"its config modifies the logits after the head ({', '.join(modifiers)})"]
    detail = "; ".join(reasons) if reasons else "no block list / final norm under the usual names"
    raise UnsupportedArchitecture(
        f"unsupported architecture: {mt}; supported: {', '.join(supported_model_types())} "
        f"(the generic fallback could not validate it: {detail[:300]})"
    )


@torch.inference_mode()
def _validate(model: torch.nn.Module, fam: Family) -> str | None:
    """None if ``fam`` reproduces ``model``'s forward (see :func:`generic_family`), else the reason."""
    try:
        loc = _locate_with(model, fam)
    except UnsupportedArchitecture as e:
        return str(e)
    V = int(getattr(model.config, "vocab_size", 0) or loc.head.weight.shape[0])
    dev = next(model.parameters()).device
    ids = torch.randint(min(4, V - 1), min(V, 1000), (1, 6), generator=torch.Generator().manual_seed(0)).to(dev)
    calls: list = []
    outs: list = []

    def pre(mod, args, kwargs):
        calls.append((args, kwargs))

    def post(mod, args, out):
        outs.append(out[0] if isinstance(out, tuple) else out)

    handles = [b.register_forward_pre_hook(pre, with_kwargs=True) for b in loc.blocks]
    handles.append(loc.blocks[-1].register_forward_hook(post))
    try:
        logits = model(input_ids=ids, use_cache=False).logits
    except Exception as e:  # any failure means "cannot validate"
        return f"forward failed ({type(e).__name__})"
    finally:
        for h in handles:
            h.remove()
    if len(calls) != len(loc.blocks) or not outs:
        return "the blocks are not each called once per forward"
    try:
        again = loc.head(loc.final_norm(outs[0])).float()
    except Exception as e:
        return f"final norm + head do not apply to the last block's output ({type(e).__name__})"
    tol = 1e-4 if logits.dtype == torch.float32 else 2e-2
    scale = logits.float().abs().max().clamp_min(1.0)
    if again.shape != logits.shape or (again - logits.float()).abs().max() > tol * scale:
        return "final norm + head do not reproduce the logits (extra projection, soft-capping or scaling?)"
    if not model.training:
        args, kwargs = calls[0]
        h = args[0] if args else kwargs["hidden_states"]
        for block, (args, kwargs) in zip(loc.blocks, calls):
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            out = block(h, *args[1:], **rest)
            h = out[0] if isinstance(out, tuple) else out
        if (h.float() - outs[0].float()).abs().max() > tol * outs[0].float().abs().max().clamp_min(1.0):
            return "replaying the blocks slot by slot does not reproduce the forward"
    return None


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
        got.append((tuple(args[1:]), {k: v for k, v in kwargs.items() if k != "hidden_states"}))
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


def num_layers_in_config(config, fam: Family) -> int | None:
    for key in fam.num_layers_keys:
        v = getattr(config, key, None)
        if isinstance(v, int):
            return v
    return None


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
    ctx = context_length(model.config, known_family(mt) or _GENERIC.get(model))
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
