"""One model type checked as a new user's model would be: a tiny random model of it (:mod:`swapkl.model.tiny`),
located, scored under both per-layer definitions and compared with the plain implementation, for whole blocks and
for attention / MLP sublayers.

A check never raises: every outcome is a row field, "exact", or "refused: <the one line swapkl prints>", or, for
anything else, "traceback: <the error>" (which the family sweep counts as a failure).  Numbers are compared where the
model computes in float64 (both the engine and the plain implementation: errors of 1e-12, so 1e-6 relative separates
a wrong number from rounding); a model whose forward needs float32 is compared at 1e-4 relative, with 1e-7 nats of
absolute slack for KLs that small.
"""
from __future__ import annotations

import tempfile
import time
import traceback

import torch

from swapkl.contract import PER_LAYER, SUBLAYERS, pair_list
from swapkl.errors import SwapklError
from swapkl.model.projections import out_width

#: what a check prints for a pair set computed exactly
EXACT = "exact"
#: tolerances (relative, absolute nats) by the dtype the check ran in
TOLERANCE = {torch.float64: (1e-6, 1e-12), torch.float32: (1e-4, 1e-7)}


def one_line(e: BaseException, prefix: str) -> str:
    """``prefix: message`` of an exception, its first line, at most 300 characters."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return f"{prefix}: {first[:300]}"


def tiny_for_check(model_type: str, layers: int = 4):
    """``(model, ids, dtype)``: the tiny model of ``model_type`` in float64 when its forward runs there (float32
    otherwise), and 2 prompts of 10 random tokens (the engine's calls of 3 rows split the prompts' row sets)."""
    from swapkl.model.tiny import tiny_model

    model = tiny_model(model_type, layers)
    V = int(model.config.get_text_config().vocab_size)
    ids = torch.randint(3, min(V, 200), (2, 10), generator=torch.Generator().manual_seed(1))
    model, dtype = widest(model, ids)
    return model, ids, dtype


def widest(model, ids) -> tuple[torch.nn.Module, torch.dtype]:
    """``(model, dtype)``: ``model`` in float64 when its forward runs there on ``ids``, else in float32 (a model
    that hard-codes float32 somewhere, or whose MoE experts run a grouped matmul without a float64 kernel)."""
    try:
        wide = model.double()
        with torch.inference_mode():
            wide(input_ids=ids[:1], use_cache=False)
        return wide, torch.float64
    except Exception:
        return model.float(), torch.float32


def compare(model, ids, dtype, unit: str, per_layer: str, pairs: str = "all") -> dict:
    """Both matrices of ``model``'s ``pairs`` under ``per_layer`` for ``unit``: the engine (batched, rows split
    across calls) against the plain implementation (batch of one, float64 KL).  ``{"status", "worst", "min_kl",
    "na"}``: status "exact", or "wrong: ..." with the worst pair."""
    from swapkl.scoring.engine import SwapEngine
    from swapkl.scoring.reference import reference_sweep

    L = len(_blocks(model))
    pairs = pair_list(pairs, L)
    engine = SwapEngine(model, ids, max_rows=3, max_live=6, unit=unit, per_layer=per_layer, kl_dtype=torch.float64)
    undefined = engine.undefined(pairs)
    todo = [p for p in pairs if p not in undefined]
    got = engine.sweep(todo)
    ref = reference_sweep(model, ids, pairs, unit=unit, per_layer=per_layer)
    if set(ref) != set(todo):
        return {"status": f"wrong: n/a pairs {sorted(undefined)}, the plain implementation's {sorted(set(pairs) - set(ref))}"}
    rtol, atol = TOLERANCE[dtype]
    worst, where, min_kl = 0.0, None, None
    for p in todo:
        for k, r in ref[p].items():
            g = got[p][k].double()
            excess = ((g - r).abs() - atol).clamp_min(0) / r.abs().clamp_min(1e-300)
            if excess.max().item() > worst:
                worst, where = excess.max().item(), (p, k)
            m = r.mean().item()
            min_kl = m if min_kl is None else min(min_kl, m)
    out = {"worst": worst, "min_kl": min_kl, "na": len(undefined)}
    out["status"] = EXACT if worst <= rtol else f"wrong: {where} off by {worst:.2e} relative"
    return out


#: the removal sets an export is checked on (one middle block, then two: the default candidates leave the first and
#: last layer alone)
EXPORT_SETS = ((1,), (1, 2))


def plain_removal(model, ids, remove) -> torch.Tensor:
    """Logits of ``model`` with the blocks ``remove`` skipped (each passes its input on: its hidden states, and what
    the block before it handed on, :mod:`swapkl.model.handed`): the plain removal."""
    from swapkl.model.block_io import as_kind, call_args, hidden_in
    from swapkl.model.handed import get_arg

    blocks = _blocks(model)
    channels = _channels(model, ids, blocks)

    def skip(mod, args, kwargs, out):
        h = hidden_in(args, kwargs)
        if not isinstance(out, (tuple, list)):
            return h
        items = [h, *out[1:]]
        given = call_args(args, kwargs)
        for c in channels:
            items[c.out] = get_arg(*given, c.arg)
        return as_kind(type(out), items)

    hooks = [blocks[k].register_forward_hook(skip, with_kwargs=True) for k in remove]
    try:
        with torch.inference_mode():
            return model(input_ids=ids, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()


def _channels(model, ids, blocks) -> tuple:
    """The states ``model``'s blocks hand on to each other (:func:`swapkl.model.handed.find_channels`), read off one
    forward."""
    from swapkl.model.block_io import record_calls
    from swapkl.model.handed import find_channels

    with torch.inference_mode():
        calls, outs = record_calls(blocks, lambda: model(input_ids=ids[:1], use_cache=False))
    return find_channels([c[1:] for c in calls], outs)


def check_export(model, ids, dtype, folder) -> dict:
    """Each of :data:`EXPORT_SETS` removed in memory (``pruned_copy``) and exported (``save_pruned``, reloaded with
    stock ``AutoModelForCausalLM.from_pretrained``): both equal the plain removal.  ``{"status"}``: "exact",
    "refused: ..." (the export's one line) or "wrong: ..."."""
    import transformers as tf

    from swapkl.surgery.prune import pruned_copy, save_pruned

    rtol, atol = TOLERANCE[dtype]
    for k, remove in enumerate(EXPORT_SETS):
        want = plain_removal(model, ids, remove).double()
        try:
            with torch.inference_mode():
                mem = pruned_copy(model, list(remove))(input_ids=ids, use_cache=False).logits.double()
        except SwapklError:
            raise
        except Exception as e:  # the model's own forward cannot run its shortened stack
            return {"status": one_line(e, f"refused: the model's forward fails without layers {list(remove)} "
                                          f"({type(e).__name__})")}
        if (mem - want).abs().max() > 10 * rtol * want.abs().max():
            return {"status": f"wrong: the in-memory removal of {list(remove)} differs from the plain removal by "
                              f"{(mem - want).abs().max().item():.2e}"}
        out = save_pruned(model, list(remove), f"{folder}/{k}")
        back = tf.AutoModelForCausalLM.from_pretrained(out, dtype=dtype).eval()
        with torch.inference_mode():
            got = back(input_ids=ids, use_cache=False).logits.double()
        if got.shape != want.shape or (got - want).abs().max() > 10 * rtol * want.abs().max():
            diff = (got - want).abs().max().item() if got.shape == want.shape else f"shape {list(got.shape)}"
            return {"status": f"wrong: the reloaded export without {list(remove)} differs from the plain removal "
                              f"by {diff}"}
    return {"status": EXACT}


def check_fold(model, ids, dtype) -> dict:
    """The folded bridge of span [1, 2) on a random map ``W`` near the identity: the bridged model
    (:func:`~swapkl.repair.bridge.bridged_model`, block 1 removed, ``W`` folded into block 0's MLP output projection)
    equals the plain definition (block 1 skipped, the projection's output multiplied by ``W`` by a hook).
    ``{"status"}``: "folded into PATH", "residual only: <why>" or "wrong: ..."."""
    import numpy as np

    from swapkl.repair.bridge import Bridge, NoExactFold, bridged_model, fold_target

    try:
        proj = fold_target(model, 1)
    except NoExactFold as e:
        return {"status": f"residual only: {str(e).split(': use --form')[0].removesuffix('; use --form residual')}"}
    D = out_width(proj)
    W = np.eye(D) + 0.1 * np.random.default_rng(0).standard_normal((D, D))
    Wt = torch.as_tensor(W, dtype=proj.weight.dtype)
    hook = proj.register_forward_hook(lambda m, a, o: o @ Wt)
    try:
        want = plain_removal(model, ids, (1,)).double()
    finally:
        hook.remove()
    with torch.inference_mode():
        got = bridged_model(model, [Bridge(1, 2, "folded", W)])(input_ids=ids, use_cache=False).logits.double()
    rtol, _ = TOLERANCE[dtype]
    if (got - want).abs().max() > 10 * rtol * want.abs().max():
        return {"status": f"wrong: the folded bridge differs from its definition by {(got - want).abs().max().item():.2e}"}
    return {"status": f"folded into {locate_family(model).mlp_out}"}


def locate_family(model):
    from swapkl.model.architectures import locate

    return locate(model).family


def _blocks(model):
    from swapkl.model.architectures import locate

    return locate(model).blocks


def check_model_type(model_type: str) -> dict:
    """The row of one model type (see the module docstring): ``status`` ("exact", "refused", "not decoder-only",
    "unbuildable", "wrong", "traceback"), ``reason``, and per check ``slot``, ``block``, ``sublayers``."""
    from swapkl.model.architectures import locate
    from swapkl.model.tiny import not_decoder_only
    from swapkl.model.units import layout_for

    t0 = time.perf_counter()
    row: dict = {"model_type": model_type}
    skip = not_decoder_only()
    if model_type in skip:
        return row | {"status": "not decoder-only", "reason": skip[model_type]}
    try:
        model, ids, dtype = tiny_for_check(model_type)
    except Exception as e:  # transformers itself cannot build or run it at tiny size
        return row | {"status": "unbuildable", "reason": one_line(e, "transformers cannot build it at tiny size")}
    row["dtype"] = str(dtype).removeprefix("torch.")
    try:
        loc = locate(model)
    except SwapklError as e:
        return row | {"status": "refused", "reason": one_line(e, "refused")}
    except Exception as e:
        return row | {"status": "traceback", "reason": one_line(e, f"traceback ({type(e).__name__})")}
    row.update(family=loc.family.name, output=loc.family.output)
    for per_layer in PER_LAYER:
        row[per_layer] = _guarded(lambda pl=per_layer: compare(model, ids, dtype, "block", pl))
    try:
        layout_for(model, loc)
        row["sublayers"] = {f"{u}/{pl}": _guarded(lambda u=u, pl=pl: compare(model, ids, dtype, u, pl, "adjacent"))
                            for u in SUBLAYERS for pl in PER_LAYER}
    except SwapklError as e:
        row["sublayers"] = {"status": one_line(e, "refused")}
    with tempfile.TemporaryDirectory() as folder:
        row["export"] = _guarded(lambda: check_export(model, ids, dtype, folder))
    row["bridge"] = _guarded(lambda: check_fold(model, ids, dtype))
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row | _verdict(row)


def _guarded(fn) -> dict:
    try:
        return fn()
    except SwapklError as e:
        return {"status": one_line(e, "refused")}
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        return {"status": one_line(e, f"traceback ({type(e).__name__} at {where.name}:{where.lineno})")}


def _verdict(row: dict) -> dict:
    parts = [row[pl]["status"] for pl in PER_LAYER] + [row["export"]["status"]]
    if all(p == EXACT for p in parts):
        return {"status": "exact", "reason": ""}
    bad = next(p for p in parts if p != EXACT)
    kind = "traceback" if bad.startswith("traceback") else "wrong" if bad.startswith("wrong") else "refused"
    return {"status": kind, "reason": bad}
