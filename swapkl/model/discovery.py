"""The validated generic fallback (as nnterp's default family): a model type that is not in the family table is
found by its modules and accepted only when what was found reproduces the model's own forward.

Candidates: every ``ModuleList`` holding as many modules as the config has layers (the usual spellings first, then
the shallowest); for each, the final-norm candidates among its siblings (the usual names, then any module whose
class is a norm).  On a short random input (``use_cache=False``) a candidate must have every block called exactly
once, in order; replaying the blocks one slot at a time with the arguments the model passed them (a state the blocks
hand on to each other, :mod:`swapkl.model.handed`, passed from each to the next) must reproduce the last block's
output (eval mode); and an output function (:mod:`swapkl.model.outputs`) must reproduce the logits from
it: the final norm and the head when they do, else the model's own tail (soft-capping, scaling, extra heads), on
the last hidden states or, where the head reads both, on them joined with the handed-on states (Reformer's two
reversible streams, ``Family.state_join``).
"""
from __future__ import annotations

import weakref
from dataclasses import replace

import torch

from swapkl.model import knowledge
from swapkl.model.nested import flatten
from swapkl.model.families import Family, UnsupportedArchitecture, get_path, locate_with, supported_model_types
from swapkl.model.block_io import as_kind, call_args, hidden_in, hidden_of
from swapkl.model.handed import (JOINS, UnsupportedHandedOn, find_channels, get_arg, handed_out, joined_state,
                                 with_args)
from swapkl.model.outputs import OUTPUTS
from swapkl.model.projections import LINEAR_LAYOUT, weight_layout

# The usual spellings, tried first (any other list of the right length follows): data/generic.json
GENERIC_BLOCK_PATHS = knowledge.strings("generic", "block_paths")
GENERIC_NORM_NAMES = knowledge.strings("generic", "norm_names")
GENERIC_LAYER_IDX = knowledge.strings("generic", "layer_idx")
GENERIC_LAYER_KEYS = knowledge.strings("generic", "layer_keys")
GENERIC_CONTEXT_KEYS = knowledge.strings("generic", "context_keys")
# config entries that make later blocks read the keys and values an earlier block stored (a second state between
# blocks, through an argument): a positive value is refused
KV_SHARING_KEYS = knowledge.strings("generic", "kv_sharing_keys")
# config entries that change the logits after the output head (soft-capping, scaling): where one is set, the final
# norm and head alone are not the output function even when they happen to come close on a short probe
LOGIT_MODIFIERS = knowledge.strings("generic", "logit_modifiers")

# the longest refusal, in characters (the support table's one line: the reasons of the candidates that fit, whole)
MESSAGE_CHARS = 300

# where a block's MLP output projection usually is (the linear bridge folds into it, docs/repair.md)
GENERIC_MLP_OUTS = knowledge.strings("generic", "mlp_outs")

_GENERIC: weakref.WeakKeyDictionary[torch.nn.Module, Family] = weakref.WeakKeyDictionary()
#: the user's families, per model object, each validated on its model (:mod:`swapkl.model.user_family`)
_USER: weakref.WeakKeyDictionary[torch.nn.Module, Family] = weakref.WeakKeyDictionary()


def found_family(model: torch.nn.Module) -> Family | None:
    """The family the fallback found for ``model`` earlier (memoised per model object), or None."""
    return _GENERIC.get(model)


def registered_family(model: torch.nn.Module) -> Family | None:
    """The user's family registered for ``model`` (:func:`swapkl.model.user_family.register_family`, once it
    validated on that model object), or None: :func:`swapkl.model.architectures.locate` prefers it to any other."""
    return _USER.get(model)


def remember_user_family(model: torch.nn.Module, fam: Family) -> None:
    """Keep ``fam`` as ``model``'s family (only :mod:`swapkl.model.user_family` calls this, after validating it)."""
    _USER[model] = fam


def layer_counts(config) -> dict[str, int]:
    """``{key: count}`` of the layer counts a config states under the usual keys (LongCat-Flash states two: its
    ``num_layers`` blocks hold two sublayers each, ``num_hidden_layers``)."""
    return {k: getattr(config, k) for k in GENERIC_LAYER_KEYS
            if isinstance(getattr(config, k, None), int) and not isinstance(getattr(config, k), bool)}


def block_lists(model: torch.nn.Module, counts: dict[str, int]) -> list[str]:
    """Paths of the module lists that may be the block list: as many modules as one of the config's layer
    ``counts`` (two or more when it states none), the usual spellings first, then by depth."""
    sizes = set(counts.values())
    found = [name for name, mod in model.named_modules()
             if isinstance(mod, torch.nn.ModuleList) and len(mod) > 0 and (len(mod) in sizes if sizes else len(mod) >= 2)]
    usual = [p for p in GENERIC_BLOCK_PATHS if p in found]
    return usual + sorted((p for p in found if p not in usual), key=lambda p: (p.count("."), p))


def norm_candidates(model: torch.nn.Module, blocks_path: str) -> list[str]:
    """Paths of the block list's siblings that may be the final norm: the usual names, then any norm module."""
    parent_path = blocks_path.rpartition(".")[0]
    parent = get_path(model, parent_path) if parent_path else model
    children = dict(parent.named_children()) if parent is not None else {}
    usual = [n for n in GENERIC_NORM_NAMES if isinstance(children.get(n), torch.nn.Module)]
    other = [n for n, m in children.items() if n not in usual and "norm" in type(m).__name__.lower()]
    return [f"{parent_path}.{n}" if parent_path else n for n in usual + other]


def generic_family(model: torch.nn.Module) -> Family:
    """A :class:`Family` for a model whose ``model_type`` is not in the table (see the module docstring).  Raises
    :class:`UnsupportedArchitecture` (the usual message plus why each candidate failed) when none validates.
    Memoised per model object."""
    if model in _GENERIC:
        return _GENERIC[model]
    mt = getattr(model.config, "model_type", "?")
    text = model.config.get_text_config()
    shared = [k for k in KV_SHARING_KEYS if isinstance(getattr(text, k, None), int) and getattr(text, k) > 0]
    reasons = [f"its last {getattr(text, shared[0])} layers reuse keys and values stored by earlier layers "
               f"({shared[0]}): a second state between blocks"] if shared else []
    counts = layer_counts(text)
    for path in block_lists(model, counts) if not shared else ():
        keys = tuple(k for k, v in counts.items() if v == len(get_path(model, path))) + GENERIC_LAYER_KEYS
        norms = norm_candidates(model, path)
        base = Family(name=f"generic:{mt}", model_types=(mt,), blocks=path, final_norm=norms[0] if norms else "",
                      layer_idx_attrs=GENERIC_LAYER_IDX, num_layers_keys=tuple(dict.fromkeys(keys)),
                      context_keys=GENERIC_CONTEXT_KEYS, generic=True, output="tail",
                      notes="found and validated by the generic fallback")
        fam, why = _validate(model, base, norms)
        if fam is not None:
            _GENERIC[model] = fam
            return fam
        reasons.append(f"{path}: {why}")
    head = (f"unsupported architecture: {mt}; supported: {', '.join(supported_model_types())} "
            "(the generic fallback could not validate it: ")
    detail = "; ".join(reasons) if reasons else _no_list(model, counts)
    raise UnsupportedArchitecture(head + _clipped(detail, MESSAGE_CHARS - 1 - len(head)) + ")")


def _clipped(detail: str, limit: int) -> str:
    """``detail`` ("reason; reason; ...") in at most ``limit`` characters: after its last whole reason that fits, then
    "; ...", or cut at ``limit`` when not even the first fits."""
    if len(detail) <= limit:
        return detail
    cut = detail.rfind("; ", 0, limit - 5)
    return detail[:cut] + "; ..." if cut > 0 else detail[:limit]


def _no_list(model: torch.nn.Module, counts: dict[str, int]) -> str:
    """Why no module list is a candidate: the layer counts the config states and the lengths of the model's module
    lists (a model whose layer count counts calls of fewer modules, run in cycles, has none of that length)."""
    sizes = sorted(len(m) for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0)
    stated = ", ".join(f"{k} = {v}" for k, v in counts.items()) or "none stated"
    held = ", ".join(map(str, sizes[:8])) + (", ..." if len(sizes) > 8 else "") if sizes else "none"
    return f"no list of blocks as long as its layer count ({stated}; its module lists hold {held})"


def _call_order(calls: list, n: int) -> str:
    """The blocks' calls of one forward, when they are not each block once in order: ``"called 0 1 2 1 2 3"`` (at
    most 16 shown), or ``"block 2 is never called"`` for a forward that skips blocks."""
    order = [c[0] for c in calls]
    missing = [k for k in range(n) if k not in order]
    if missing:
        return f"block {missing[0]} is never called"
    return "called " + " ".join(map(str, order[:16])) + (" ..." if len(order) > 16 else "")


def _second_state(model: torch.nn.Module, blocks, ids: torch.Tensor, calls: list, channels: tuple = ()) -> str:
    """Where a block reads a state that an earlier block changes besides the hidden states and the handed-on
    ``channels`` (:mod:`swapkl.model.handed`; another stream: earlier blocks' states gathered, a reversible pair),
    found by running the forward again with block 0's output nudged: ``"argument A of block k"``, or "" when every
    later call is the same."""
    again: list = []

    def nudge(mod, args, out):
        h = hidden_of(out)
        h2 = h + 0.1 * h.abs().mean().clamp_min(1e-3) * torch.randn(h.shape, generator=torch.Generator().manual_seed(1)).to(h)
        return as_kind(type(out), (h2, *out[1:])) if isinstance(out, (tuple, list)) else h2

    def pre(slot):
        def hook(mod, args, kwargs):
            again.append((slot, args, kwargs))
        return hook

    handles = [b.register_forward_pre_hook(pre(s), with_kwargs=True) for s, b in enumerate(blocks)]
    handles.append(blocks[0].register_forward_hook(nudge))
    try:
        model(input_ids=ids, use_cache=False)
    except Exception as e:  # a forward that fails nudged fails below as a replay
        return f"a nudged forward fails ({type(e).__name__})"
    finally:
        for h in handles:
            h.remove()
    for (slot, args, kwargs), (_, args2, kwargs2) in zip(calls[1:], again[1:]):
        handed = {c.arg + (1 if args else 0) if isinstance(c.arg, int) else c.arg for c in channels}
        names = [n for n in [*range(1, len(args)), *[k for k in kwargs if k != "hidden_states"]] if n not in handed]
        first = [args[k] if isinstance(k, int) else kwargs[k] for k in names]
        second = [args2[k] if isinstance(k, int) else kwargs2[k] for k in names]
        for name, x, y in zip(names, first, second):
            xs, ys = flatten(x)[1], flatten(y)[1]
            for u, v in zip(xs, ys):
                if isinstance(u, torch.Tensor) and isinstance(v, torch.Tensor) and (
                        u.shape != v.shape or (u.is_floating_point() and not torch.equal(u, v))
                        or (not u.is_floating_point() and not torch.equal(u, v))):
                    return f"argument {name} of block {slot}"
    return ""


def _mlp_output(block: torch.nn.Module, call: tuple, tol: float, paths: tuple[str, ...] = GENERIC_MLP_OUTS) -> tuple[str, str]:
    """``(path, layout)`` of the block's MLP output projection, the first of ``paths`` whose output goes into the
    residual stream as it is (doubling its weight and bias adds exactly its output once more to the block's output: no
    norm after it), else ``("", "linear")``.  The layout is :func:`swapkl.model.projections.weight_layout`'s."""
    from torch.func import functional_call

    _, args, kwargs = call
    for path in paths:
        proj = get_path(block, path)
        w = getattr(proj, "weight", None)
        if not isinstance(proj, torch.nn.Module) or not isinstance(w, torch.Tensor) or w.dim() != 2:
            continue
        layout = weight_layout(proj)
        seen: list = []
        hook = proj.register_forward_hook(lambda m, a, o, seen=seen: seen.append(o.clone()))  # added into in place
        try:
            one = block(*args, **kwargs)
            doubled = {f"{path}.{n}": 2 * t for n, t in proj.named_parameters(recurse=False)}
            two = functional_call(block, doubled, args, kwargs)
        except Exception:  # a block that cannot run alone here: no fold found
            return "", LINEAR_LAYOUT
        finally:
            hook.remove()
        one, two = (x[0] if isinstance(x, (tuple, list)) else x for x in (one, two))
        if len(seen) != 2 or seen[0].numel() != one.numel():
            continue
        if (two - one - seen[0].reshape(one.shape)).abs().max() <= tol * one.abs().max().clamp_min(1.0):
            return path, layout
    return "", LINEAR_LAYOUT


@torch.inference_mode()
def _validate(model: torch.nn.Module, base: Family, norms: list[str], outputs: tuple[str, ...] = ("head", "tail"),
              mlp_outs: tuple[str, ...] = GENERIC_MLP_OUTS) -> tuple[Family | None, str]:
    """``(family, "")`` for the first output function (of ``outputs``; "head" with each of ``norms``) that
    reproduces ``model``'s forward with ``base``'s blocks, its MLP output the first of ``mlp_outs`` that folds
    exactly, else ``(None, reason)``.  A user's family description is checked here too (one norm, its own output
    function and MLP output: :mod:`swapkl.model.user_family`)."""
    try:
        loc = locate_with(model, base)
    except UnsupportedArchitecture as e:
        return None, str(e)
    V = int(getattr(model.config.get_text_config(), "vocab_size", 0) or loc.head.weight.shape[0])
    dev = next(model.parameters()).device
    ids = torch.randint(min(4, V - 1), min(V, 1000), (2, 7), generator=torch.Generator().manual_seed(0)).to(dev)
    calls: list = []
    outs: list = []

    def pre(slot):
        def hook(mod, args, kwargs):
            calls.append((slot, args, kwargs))
        return hook

    def post(mod, args, out):
        outs.append(out)

    handles = [b.register_forward_pre_hook(pre(s), with_kwargs=True) for s, b in enumerate(loc.blocks)]
    handles += [b.register_forward_hook(post) for b in loc.blocks]
    try:
        logits = model(input_ids=ids, use_cache=False).logits
    except Exception as e:  # any failure means "cannot validate"
        return None, f"forward failed ({type(e).__name__})"
    finally:
        for h in handles:
            h.remove()
    if [c[0] for c in calls] != list(range(len(loc.blocks))) or len(outs) != len(loc.blocks):
        return None, f"the blocks are not each called once per forward, in order ({_call_order(calls, len(loc.blocks))})"
    try:
        channels = find_channels([call_args(a, k) for _, a, k in calls], outs)
    except UnsupportedHandedOn as e:
        return None, f"its blocks read a second state that earlier blocks change ({e})"
    second = _second_state(model, loc.blocks, ids, calls, channels)
    if second:
        return None, f"its blocks read a second state that earlier blocks change ({second})"
    out = outs[-1]
    last = hidden_of(out)
    if not isinstance(last, torch.Tensor) or last.dim() < 3 or 2 not in last.shape:
        return None, "a block's output is not a hidden state with a batch dimension"
    if 7 not in last.shape:
        return None, ("its blocks run over other positions than the input's tokens (a hidden state of shape "
                      f"{list(last.shape)} for {ids.shape[1]} tokens)")
    tuple_len = len(out) if isinstance(out, (tuple, list)) else 0
    tol = 1e-4 if logits.dtype == torch.float32 else 2e-2
    if not model.training:
        why = _replay(loc.blocks, calls, channels, last, tol)
        if why:
            return None, why
    states = {"": last}  # what the output function may read: the hidden states, or joined with the handed-on states
    handed = handed_out(out, channels) if channels else ()
    if handed and all(isinstance(t, torch.Tensor) and t.shape[:-1] == last.shape[:-1] for t in handed):
        states.update({j: joined_state(last, handed, j) for j in JOINS if j})
    fam = _output_function(model, base, norms, outputs, states, logits, tol, tuple_len)
    if fam is None:
        return None, ("neither the final norm and head nor the model's own tail reproduce the logits"
                      if outputs == ("head", "tail") else f"the output function ({outputs[0]}"
                      f"{': ' + norms[0] + ' and the head' if outputs[0] == 'head' else ''}) does not reproduce the logits")
    path, layout = _mlp_output(loc.blocks[0], calls[0], tol, mlp_outs)
    return replace(fam, mlp_out=path, mlp_out_layout=layout), ""


def _output_function(model, base: Family, norms: list[str], outputs: tuple[str, ...], states: dict,
                     logits: torch.Tensor, tol: float, tuple_len: int) -> Family | None:
    """``base`` with the first output function of ``outputs`` (and the state it reads, ``states``: ``{join: [..., T,
    D]}``) that reproduces ``logits`` [B, T, V] within ``tol`` of their largest magnitude, or None.  A config that
    modifies the logits after the head (:data:`LOGIT_MODIFIERS`) rules out "head"."""
    scale = logits.float().abs().max().clamp_min(1.0)
    text = model.config.get_text_config()
    modified = any(getattr(text, k, None) not in (None, 1, 1.0, False) for k in LOGIT_MODIFIERS)
    options = [] if modified or "head" not in outputs else [
        replace(base, final_norm=n, output="head", block_tuple=tuple_len) for n in norms]
    options += [replace(base, output="tail", block_tuple=tuple_len)] if "tail" in outputs else []
    for fam in options:
        for join, state in states.items():
            try:
                got = OUTPUTS[fam.output].logits(model, locate_with(model, fam), state).float()
            except Exception:  # this output function does not apply to the model
                continue
            if got.shape == logits.shape and (got - logits.float()).abs().max() <= tol * scale:
                return replace(fam, state_join=join)
    return None


def _replay(blocks, calls: list, channels: tuple, last: torch.Tensor, tol: float) -> str:
    """Why replaying ``blocks`` one slot at a time with their recorded ``calls`` (the handed-on ``channels`` passed
    from each block to the next) does not reproduce the forward's last hidden states ``last``, or ""."""
    _, args, kwargs = calls[0]
    h = hidden_in(args, kwargs)
    state = tuple(get_arg(*call_args(args, kwargs), c.arg) for c in channels)
    try:
        for block, (_, args, kwargs) in zip(blocks, calls):
            a, k = with_args(*call_args(args, kwargs), channels, state)
            o = block(h, *a, **k) if args else block(**{**k, "hidden_states": h})
            h = o[0] if isinstance(o, (tuple, list)) else o
            state = handed_out(o, channels)
    except Exception as e:  # a block that cannot be run alone with its recorded call
        return f"a block run alone with its recorded call fails ({type(e).__name__})"
    if (h.float() - last.float()).abs().max() > tol * last.float().abs().max().clamp_min(1.0):
        return "replaying the blocks slot by slot does not reproduce the forward"
    return ""
