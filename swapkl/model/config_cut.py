"""The config of a shortened stack: rewritten so that stock ``transformers`` builds the same blocks, or refused.

Removing blocks changes what a config's per-layer settings mean: a list with one entry per layer is cut in step; a
list of layer indices, a "first k layers" count and a dict keyed by layer index are renumbered; layer counts shrink
(proportionally where a model counts sublayers).  What the rules cover is data (``data/config_keys.json``: :data:`INDEX_LISTS`,
:data:`PREFIX_COUNTS` ...); whatever a rule does, :func:`structure_difference` then builds the shortened model from the
new config on the ``meta`` device (no memory, no weights) and compares every new block with the kept block it must
be - class, weight names and shapes, and plain settings (attention type, window, head size, constants derived from
the layer index) - so a config whose meaning shifts in a way no rule follows is refused in one line, never exported
wrong.  A setting that changes no output where it differs is compared only where it would (:data:`READ_BY`: read by
no kept block; :data:`BUILD_ONLY`: its buffers saved with the weights); module attributes holding layer indices are
renumbered on the shortened copy (:data:`INDEX_KEYED_ATTRS`); a model whose config class has no causal LM of its own
is saved in the wrapper config that leads ``AutoModelForCausalLM`` to its class (:func:`reload_config`).
"""
from __future__ import annotations

from typing import Iterable

from swapkl.errors import SwapklError
from swapkl.model import knowledge


class ConfigCutError(SwapklError):
    """A shortened stack that its config cannot describe (one line: which setting, which layer)."""


def _periodic() -> tuple[tuple[tuple[str, ...], str, str], ...]:
    """:data:`PERIODIC` from ``data/config_keys.json`` (each entry ``{"keys": [...], "form": "mod"|"step",
    "explicit": key or ""}``)."""
    out = []
    for k, e in enumerate(knowledge.entry("config_keys", "periodic")):
        keys, form, explicit = (e.get(f) if hasattr(e, "get") else None for f in ("keys", "form", "explicit"))
        if not isinstance(keys, tuple) or not 1 <= len(keys) <= 2 or form not in ("mod", "step") or not isinstance(explicit, str):
            raise knowledge.KnowledgeError(f"config_keys.json: key 'periodic[{k}]' must be {{keys: 1-2 names, form: mod|step, "
                                           "explicit: a key or ''}")
        out.append((keys, form, explicit))
    return tuple(out)


# The tables below are data/config_keys.json (swapkl.model.knowledge)
#: keys counting layers (the first equal to the block count counts blocks; a multiple counts sublayers)
LAYER_COUNT_KEYS = knowledge.strings("config_keys", "layer_count_keys")
#: keys holding a list of layer indices (a layer has the property when its index is listed)
INDEX_LISTS = knowledge.strings("config_keys", "index_lists")
#: keys counting the first layers that have a property (DeepSeek's dense layers, Qwen2's full-attention layers)
PREFIX_COUNTS = knowledge.strings("config_keys", "prefix_counts")
#: keys holding a pattern that repeats over the layers (layer i has ``pattern[i % len(pattern)]``): the cut stack
#: gets its own layers' entries as the pattern (RecurrentGemma's ``block_types``)
CYCLES = knowledge.strings("config_keys", "cycles")
#: keys that a model divides by a power of the layer count (MiniCPM's residual scale ``scale_depth / √L``): rescaled
#: by ``(L' / L) ** power`` so that every kept layer keeps its constant
COUNT_SCALED = knowledge.mapping("config_keys", "count_scaled", (int, float))
#: keys holding a dict keyed by layer index (as a string or an int)
INDEX_DICTS = knowledge.strings("config_keys", "index_dicts")
#: keys that put a property on every p-th layer: ``mod`` (layer i has it when i % period == offset) or ``step`` (when
#: (i + 1) % period == 0); a cut stack gets the period (and offset) that describes its kept layers, when one does
#: (a key naming a per-layer list that, when the config has it, says the same explicitly: the period is then left alone)
PERIODIC = _periodic()
#: block settings that only other blocks read, each with the setting that marks such a reader: a block that keeps its
#: keys and values for the KV-sharing blocks after it (Gemma-3n, Gemma-4; the config makes the last non-sharing block
#: of each attention type the one that stores).  Compared only when the shortened stack keeps a reader: without one,
#: which block stores changes no output (a stack with readers is refused before any cut: ``discovery``)
READ_BY = knowledge.mapping("config_keys", "read_by", str)
#: settings a module reads only to build persistent buffers (``Class.attribute`` -> the buffers): the export saves the
#: kept block's buffers and a reload reads them back instead of building its own, so the setting is compared only
#: where one of those buffers is missing from the module's state dict (MiniMax's lightning attention derives its
#: decay rates from its position in the stack, ``1 - layer_idx / (num_hidden_layers - 1)``)
BUILD_ONLY = knowledge.mapping("config_keys", "build_only", tuple)
#: module attributes holding layer indices, as the config's index lists and dicts do, that a shortened copy renumbers
#: as the reload derives them from the cut config: a dict keyed by layer index (Zamba2's shared attention and MLP map
#: each hybrid layer's index to its adapter slot) or a list of layer indices
INDEX_KEYED_ATTRS = knowledge.strings("config_keys", "index_keyed_attrs")
#: module attributes that are the layer's index itself (renumbered on purpose), never compared
INDEX_ATTRS = frozenset(knowledge.strings("config_keys", "index_attrs"))


def cut_config(config, keep: Iterable[int], num_layers: int):
    """A new config like ``config`` for the stack that keeps blocks ``keep`` (old indices, in order) of
    ``num_layers``, built from the rewritten dict form (``to_dict`` / ``from_dict``: per-layer overrides of a
    heterogeneous config included).  Raises :class:`ConfigCutError` when a prefix count no longer describes the kept
    layers."""
    keep = list(keep)
    d = config.to_dict()
    text = config.get_text_config()
    name = next((k for k in (getattr(config, "sub_configs", None) or {}) if getattr(config, k, None) is text), None)
    cut_dict(d[name] if name and isinstance(d.get(name), dict) else d, keep, num_layers)
    new = type(config).from_dict(d)
    try:
        new._attn_implementation = config._attn_implementation
    except Exception:  # a config class without a settable attention implementation keeps its default
        pass
    return new


def cut_dict(own: dict, keep: list[int], num_layers: int) -> None:
    """:func:`cut_config` on a config's dict form, in place."""
    n_old, n_new = num_layers, len(keep)
    for key, value in list(own.items()):
        if key in INDEX_LISTS and isinstance(value, (list, tuple)) and all(isinstance(i, int) for i in value):
            own[key] = [pos for pos, old in enumerate(keep) if old in set(value)]
        elif key in PREFIX_COUNTS and isinstance(value, int) and not isinstance(value, bool):
            has = [old < value for old in keep]
            count = sum(has)
            if has != [True] * count + [False] * (n_new - count):
                raise ConfigCutError(f"the config counts the first {value} layers as different ({key}); the kept "
                                     f"layers {keep} no longer start with all of them: no {key} describes them")
            own[key] = count
        elif key in CYCLES and isinstance(value, (list, tuple)) and value:
            own[key] = [value[old % len(value)] for old in keep]
        elif key in INDEX_DICTS and isinstance(value, dict):
            own[key] = _renumber_dict(value, keep)
        elif isinstance(value, (list, tuple)) and n_old and len(value) % n_old == 0 and len(value) > 0:
            per = len(value) // n_old  # entries per layer (a model that lists its sublayers: two per layer)
            own[key] = [value[old * per + k] for old in keep for k in range(per)]
    for keys, form, explicit in PERIODIC:
        if explicit and isinstance(own.get(explicit), (list, tuple)):
            continue
        if all(isinstance(own.get(k), int) and not isinstance(own.get(k), bool) for k in keys) and own[keys[0]] > 0:
            p = own[keys[0]]
            o = own[keys[1]] if len(keys) > 1 else p - 1
            found = _period([old % p == o for old in keep], form)
            if found is not None:
                own[keys[0]] = found[0]
                if len(keys) > 1:
                    own[keys[1]] = found[1]
    for key, power in COUNT_SCALED.items():
        if isinstance(own.get(key), (int, float)) and not isinstance(own.get(key), bool):
            own[key] = own[key] * (n_new / n_old) ** power
    for key in LAYER_COUNT_KEYS:
        value = own.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value and value % n_old == 0:
            own[key] = value // n_old * n_new


def renumbered(value, keep: list[int]):
    """``value`` (a dict keyed by layer index, or a list of layer indices; old indices) for the stack that keeps
    ``keep``: only the kept layers, at their new positions; anything else unchanged."""
    if isinstance(value, dict):
        return _renumber_dict(value, keep)
    if isinstance(value, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return type(value)(pos for pos, old in enumerate(keep) if old in set(value))
    return value


def _period(flags: list[bool], form: str) -> tuple[int, int] | None:
    """The smallest ``(period, offset)`` with ``flags[i] == (i % period == offset)`` (``step``: offset = period - 1),
    or None."""
    n = len(flags)
    for p in range(1, n + 2):
        for o in (range(p) if form == "mod" else (p - 1,)):
            if [i % p == o for i in range(n)] == flags:
                return p, o
    return None


def _renumber_dict(value: dict, keep: list[int]) -> dict:
    """A dict keyed by layer index (``3``, ``"3"`` or zero-padded ``"03"``) for the kept layers, renumbered in the
    same spelling."""
    out = {}
    for k, v in value.items():
        try:
            old = int(k)
        except (TypeError, ValueError):
            out[k] = v  # not a layer index: kept as it is
            continue
        if old in keep:
            pos = keep.index(old)
            out[pos if isinstance(k, int) else (f"{pos:0{len(k)}d}" if k.startswith("0") and len(k) > 1 else str(pos))] = v
    return out


def settings(module) -> dict:
    """The plain settings of ``module`` and its submodules (numbers, strings, booleans and tuples of them), keyed by
    ``submodule.attribute``; the layer's index itself left out."""
    out = {}
    for name, mod in module.named_modules():
        for attr, v in vars(mod).items():
            if attr.startswith("_") or attr == "training" or attr in INDEX_ATTRS:
                continue
            if isinstance(v, (bool, int, float, str, type(None))) or (
                    isinstance(v, tuple) and all(isinstance(x, (bool, int, float, str)) for x in v)):
                out[f"{name}.{attr}" if name else attr] = v
    return out


def reload_config(config, model_class: type):
    """The config a saved folder of a ``model_class`` model with ``config`` carries so that stock
    ``AutoModelForCausalLM`` rebuilds that class: ``config`` itself when its class has a causal LM of its own; else the
    config of the model type whose causal LM is ``model_class`` and which holds ``config``'s class as a sub-config,
    with ``config`` as that sub-config (Emu3: ``Emu3ForCausalLM`` runs on ``Emu3TextConfig``, and only ``Emu3Config``
    leads ``AutoModelForCausalLM`` to it); ``config`` when no such model type exists (the build then refuses)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return config
    for model_type, name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if name != model_class.__name__ or model_type not in CONFIG_MAPPING:
            continue
        wrapper = CONFIG_MAPPING[model_type]
        slot = next((k for k, c in (getattr(wrapper, "sub_configs", None) or {}).items() if c is type(config)), None)
        if slot is not None:
            new = wrapper(**{slot: config.to_dict()})
            new.architectures, new.dtype = [model_class.__name__], getattr(config, "dtype", None)
            return new
    return config


def _meta_build(cls, config):
    """``(model, "")`` built from ``config`` on the ``meta`` device (no memory, no weights), as class ``cls`` or (None)
    as stock ``AutoModelForCausalLM`` would; ``(None, why)`` when it does not build."""
    import torch
    import transformers as tf

    try:
        with torch.device("meta"):
            return (cls._from_config(config) if cls is not None else tf.AutoModelForCausalLM.from_config(config)), ""
    except Exception as e:  # the rewritten config does not build
        first = str(e).splitlines()[0][:160] if str(e) else ""
        return None, f"the shortened config does not build ({type(e).__name__}: {first})"


def outside_cuts(model, config, blocks_path: str, keep: list[int], num_layers: int) -> tuple[dict, str | None]:
    """The weights outside the blocks that a stack of ``keep`` needs cut, and how: ``({name: (dim, group)}, None)``
    where a model of ``model``'s class built from ``config`` (on the ``meta`` device) holds ``len(keep) · group``
    rows along ``dim`` of a weight that ``model`` holds ``num_layers · group`` of (per-layer embeddings and their
    projection, layer by layer: Gemma-3n, Gemma-4), or ``({}, why)`` when another weight outside the blocks differs."""
    built, why = _meta_build(type(model), config)
    if built is None:
        return {}, why
    prefix = blocks_path + "."
    a = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith(prefix)}
    b = {k: tuple(v.shape) for k, v in built.state_dict().items() if not k.startswith(prefix)}
    cuts = {}
    for k in sorted(set(a) | set(b)):
        if a.get(k) == b.get(k):
            continue
        dims = [d for d, (x, y) in enumerate(zip(a.get(k) or (), b.get(k) or ())) if x != y]
        old, new = a.get(k), b.get(k)
        if old is None or new is None or len(old) != len(new) or len(dims) != 1 or old[dims[0]] % num_layers or \
                new[dims[0]] != old[dims[0]] // num_layers * len(keep):
            return {}, (f"it keeps weights outside its blocks that the shortened stack changes ({k}: {list(old or [])} "
                        f"here, {list(new or [])} for {len(keep)} layers), not layer by layer")
        cuts[k] = (dims[0], old[dims[0]] // num_layers)
    return cuts, None


def cut_rows(t, dim: int, group: int, keep: list[int]):
    """``t`` with only the kept layers' ``group`` rows along ``dim`` (layer-major), in order."""
    import torch

    idx = torch.tensor([k * group + r for k in keep for r in range(group)], device=t.device)
    return t.index_select(dim, idx)


def outside_difference(model, config, blocks_path: str) -> str | None:
    """None when a model of ``model``'s class built from ``config`` (on the ``meta`` device) has the same weights
    outside its blocks as ``model`` (names and shapes), else the first difference."""
    built, why = _meta_build(type(model), config)
    if built is None:
        return why
    prefix = blocks_path + "."
    a = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.startswith(prefix)}
    b = {k: tuple(v.shape) for k, v in built.state_dict().items() if not k.startswith(prefix)}
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            return (f"it keeps weights per layer outside its blocks ({k}: {list(a.get(k) or [])} here, "
                    f"{list(b.get(k) or [])} for the shortened stack), which removal does not cut")
    return None


def roundtrip_noise(blocks, config, blocks_path: str, num_layers: int, model_class: type | None = None) -> list[set]:
    """Per block, the settings a rebuild from ``config`` itself (its dict form, no layer cut; as a folder of a
    ``model_class`` model carries it, :func:`reload_config`) already gives other values (a tuple read back as a list,
    an infinite bound as None): not the removal's doing, so not compared."""
    same = cut_config(config, range(num_layers), num_layers)
    built, _ = _meta_build(None, same if model_class is None else reload_config(same, model_class))
    new_blocks = None if built is None else _path(built, blocks_path)
    if new_blocks is None or len(new_blocks) != len(blocks):
        return [set() for _ in blocks]
    out = []
    for a, b in zip(blocks, new_blocks):
        xa, xb = settings(a), settings(b)
        out.append({k for k in set(xa) | set(xb) if xa.get(k) != xb.get(k)})
    return out


def _path(model, path: str):
    from swapkl.model.families import get_path

    return get_path(model, path)


def rebuilt_model(config):
    """``(model, "")``: the model stock ``AutoModelForCausalLM`` builds from ``config`` on the ``meta`` device (what a
    saved folder with that config reloads as, without memory or weights), or ``(None, why)`` when it does not build."""
    return _meta_build(None, config)


def _saved(block, key: str) -> bool:
    """Whether setting ``key`` (``submodule.attribute``) of ``block`` is one of :data:`BUILD_ONLY` whose buffers are
    all in its module's state dict (saved with the export, read back by the reload)."""
    path, _, attr = key.rpartition(".")
    module = block.get_submodule(path) if path else block
    buffers = BUILD_ONLY.get(f"{type(module).__name__}.{attr}")
    return buffers is not None and set(buffers) <= set(module.state_dict(keep_vars=True))


def _unread(blocks) -> set[str]:
    """The settings of :data:`READ_BY` that no block of ``blocks`` reads (no block has its reader setting true)."""
    readers = {k.rpartition(".")[2] for b in blocks for k, v in settings(b).items() if v is True}
    return {k for k, reader in READ_BY.items() if reader not in readers}


def structure_difference(blocks, keep: list[int], config, blocks_path: str, noise: list[set] | None = None,
                         built=None) -> str | None:
    """None when the model stock ``AutoModelForCausalLM`` builds from ``config`` (what a saved folder reloads as) has,
    at ``blocks_path``, in order, blocks of the same class, weights and settings as ``blocks`` (the shortened stack's
    blocks, old layer ``keep[pos]`` at position ``pos``), else the first difference (one line).  ``noise``: per old
    layer, settings not compared (:func:`roundtrip_noise`); ``built``: that model when the caller has built it
    (:func:`rebuilt_model`)."""
    if built is None:
        built, why = rebuilt_model(config)
        if built is None:
            return why
    new_blocks = _path(built, blocks_path)
    if new_blocks is None or len(new_blocks) != len(keep):
        return f"the shortened config builds {len(new_blocks or [])} blocks, not {len(keep)}"
    unread = _unread(new_blocks)
    for pos, old in enumerate(keep):
        a, b = blocks[pos], new_blocks[pos]
        if type(a) is not type(b):
            return f"layer {old} would come back as {type(b).__name__}, not {type(a).__name__}"
        sa = {k: tuple(t.shape) for k, t in a.state_dict().items()}
        sb = {k: tuple(t.shape) for k, t in b.state_dict().items()}
        if sa != sb:
            diff = sorted(set(sa.items()) ^ set(sb.items()))[0][0]
            return f"layer {old} would come back with other weights ({diff})"
        xa, xb = settings(a), settings(b)
        skip = noise[old] if noise else set()
        for k in sorted(set(xa) | set(xb)):
            if xa.get(k) != xb.get(k) and k not in skip and k.rpartition(".")[2] not in unread and not _saved(a, k):
                return (f"layer {old} would come back with {k} = {xb.get(k)!r}, not {xa.get(k)!r} (a setting the "
                        "config derives from the layer's position)")
    return None
