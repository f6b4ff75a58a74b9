"""A tiny random causal LM of any model type the installed transformers ships, built from its config class.

The family sweep (``swapkl families``, ``tests/families/``) checks swapkl on one such model per model type, offline:
the config class's defaults with every size shrunk (4 layers, width 64, 4 heads, 4 experts, a 256-token vocabulary)
and the per-layer lists cut so that a family with mixed layers keeps them mixed (sliding and full attention, dense
and MoE blocks, attention and state-space layers).  The sizes and what the generic shrinking cannot guess are data,
``data/tiny.json`` (read through :mod:`swapkl.model.knowledge`): the sizes, settings per model type (``"overrides"``) and the model types that are not decoder-only language
models, each with its reason (``"not_decoder_only"``).
"""
from __future__ import annotations

from swapkl.model import knowledge

#: config keys and their tiny values ("L": the layer count asked for); a key is set only where the config has it
SIZES: dict[str, object] = knowledge.mapping("tiny", "sizes", (int, float, str))
#: keys set even where the default config leaves them None (an MoE config whose defaults name no experts)
FILL_NONE = frozenset(knowledge.strings("tiny", "fill_none"))
#: the token ids a tiny config uses (inside the tiny vocabulary)
TOKEN_IDS = knowledge.mapping("tiny", "token_ids", int)


def _data() -> dict:
    return knowledge.table("tiny")


def not_decoder_only() -> dict[str, str]:
    """``{model_type: reason}``: the model types of transformers' causal-LM mapping that swapkl does not count as
    decoder-only language models (encoders with a causal head, decoders of seq2seq models, audio and image models),
    each with its reason."""
    return dict(_data()["not_decoder_only"])


def causal_lm_types() -> list[str]:
    """Every model type in the installed transformers' causal-LM mapping, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def text_model_type(model_type: str) -> str | None:
    """The model type of a multimodal wrapper's text model when the wrapper's default config holds a text config of
    another type (``qwen3_5`` -> ``qwen3_5_text``), else None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cfg = CONFIG_MAPPING[model_type]()
        text = cfg.get_text_config()
    except Exception:  # a config that cannot be built by default, or several text configs
        return None
    return text.model_type if text is not cfg and text.model_type != model_type else None


def _mixed(values: list, n: int) -> list:
    """``n`` entries of a per-layer list that keep every distinct value it has (in order of first appearance where
    the first ``n`` entries miss some): ``[s, s, s, s, s, f] -> [s, s, s, f]``."""
    out = list(values[:n])
    missing = [v for v in dict.fromkeys(values) if v not in out]
    for k, v in enumerate(missing[: max(0, n - 1)]):
        out[n - 1 - k] = v
    return out


def tiny_config(model_type: str, layers: int = 4, sizes: dict | None = None, attention: str | None = "eager"):
    """A small config of ``model_type`` (see the module docstring), float32, ``attention`` its attention
    implementation (None: transformers' default).  The sub-configs of a config that has them (a wrapper's text and
    vision configs, a byte-level model's encoder and decoder) are shrunk the same way.

    ``sizes``: config keys and their values that replace the generic shrinking: the config is then the class's
    defaults with exactly these keys set (``"L"``: ``layers``; a key the class spells otherwise, through its
    ``attribute_map``, set under its own name), no list cut and no override (the test suite's family models:
    ``tests/conftest.py``)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    if sizes is not None:
        aliases = dict(getattr(cls, "attribute_map", {}) or {})
        cfg = cls(**{aliases.get(k, k): layers if v == "L" else v for k, v in sizes.items()})
    else:
        cfg = _shrunk(cls, knowledge.thawed(_data()["overrides"].get(model_type, {})), layers)
    if attention is not None:
        cfg._attn_implementation = attention
    return cfg


def _shrunk(cls, override: dict, layers: int):
    """``cls`` with every size of :data:`SIZES` it has shrunk, its per-layer lists cut (mixed where they were) and
    ``override`` applied; sub-configs shrunk alike."""
    from transformers import PreTrainedConfig

    base = override.pop("base", {})
    default = cls(**base)
    d = default.to_dict()
    aliases = dict(getattr(cls, "attribute_map", {}) or {})
    kw: dict = {}
    for key, value in SIZES.items():
        own = key if key in d else aliases.get(key)
        if own in d and (d[own] is not None or key in FILL_NONE) and not isinstance(d[own], (bool, list, dict)):
            kw[own] = layers if value == "L" else value
    heads = next((d[k] for k in ("num_attention_heads", "n_head", "num_heads", "n_heads") if isinstance(d.get(k), int)), None)
    for key in ("num_key_value_heads", "num_kv_heads"):
        if key in kw and d.get(key) == heads:  # multi-head attention stays multi-head
            kw[key] = SIZES["num_attention_heads"]
    if d.get("qk_rope_head_dim") is not None and d.get("head_dim") == d["qk_rope_head_dim"]:
        kw["head_dim"] = kw["qk_rope_head_dim"]  # multi-head latent attention: the rotary table's width
    for key, value in TOKEN_IDS.items():
        if key in d:
            kw[key] = value
    for name in getattr(cls, "sub_configs", {}) or {}:
        sub = getattr(default, name, None)
        if isinstance(sub, PreTrainedConfig) and name not in override:
            kw[name] = _shrunk(type(sub), {}, layers)
    n0 = next((d[k] for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") if isinstance(d.get(k), int)), None)
    lists = {k: v for k, v in d.items() if isinstance(v, list) and n0 and len(v) == n0 and k not in override}
    kw.update({k: None for k in lists})
    kw.update(override)
    try:
        cfg = cls(**{**base, **kw})
    except Exception:  # a list that the config does not regenerate by itself
        cfg = None
    if cfg is not None:
        for k, v in lists.items():
            got = getattr(cfg, k, None)
            if len(set(map(str, v))) > 1 and (not isinstance(got, list) or len(set(map(str, got))) <= 1):
                cfg = None
                break
    if cfg is None:
        kw.update({k: _mixed(v, layers) for k, v in lists.items()})
        cfg = cls(**{**base, **kw})
    return cfg


def tiny_model(model_type: str, layers: int = 4, seed: int = 0, scale: float = 3.0, sizes: dict | None = None,
               attention: str | None = "eager", dtype: str | None = "float32"):
    """A random-initialised causal LM of ``model_type`` (:func:`tiny_config` with ``sizes`` and ``attention``) in
    eval mode, its weights drawn after ``torch.manual_seed(seed)`` in ``dtype`` (stated in its config; None:
    torch's default dtype, the config stating none); matrices scaled by ``scale`` so that blocks differ well above
    float32 noise."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tiny_config(model_type, layers, sizes, attention)
    model = tf.AutoModelForCausalLM.from_config(cfg, **({"dtype": getattr(torch, dtype)} if dtype else {}))
    return scale_matrices(model, scale).eval()


def scale_matrices(model, scale: float = 3.0):
    """``model`` with every weight of two or more dimensions multiplied by ``scale`` in place (a random-initialised
    model's blocks then differ well above float32 noise); returns ``model``."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model
