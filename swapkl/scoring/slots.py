"""Running blocks in slots, batched: the baseline residual stream a sweep starts from (:class:`Baseline`), a block's
weights run through another slot's module (:class:`BlockRunner`, ``torch.func.functional_call``), and the batch
size that halves on out-of-memory and retries (:class:`BatchController`).  Used by :mod:`swapkl.scoring.engine`."""
from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch.func import functional_call

from swapkl.model.architectures import locate
from swapkl.model.units import check_unit, layout_for, mixed_weights, unit_keys
from swapkl.errors import ModelLoadError, SwapklError, is_oom

ProgressFn = Callable[[int, int, str], None]
PairFn = Callable[[int, int, dict], None]


class DeviceOutOfMemory(SwapklError):
    """Out of memory although the batch was already down to one prompt row (halving cannot help)."""


def free_cached_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class BatchController:
    """Holds the current maximum batch (rows of prompts per call) and halves it on out-of-memory.

    ``retries`` records every halving as ``{"where", "from", "to"}`` so callers can report it;
    ``on_retry(record)`` is called at each one.  ``fault`` is a test hook: ``fault(rows)`` or
    ``fault(rows, where)`` (``where`` in {"baseline", "block", "kl"}) is called before each call and may raise
    to simulate an out-of-memory error.  An out-of-memory error at one row raises :class:`DeviceOutOfMemory`.
    """

    def __init__(self, max_rows: int, fault: Callable | None = None, where: str = "block",
                 on_retry: Callable[[dict], None] | None = None, retries: list | None = None):
        self.max_rows = max(1, int(max_rows))
        self.retries: list[dict] = retries if retries is not None else []
        self.where = where
        self.on_retry = on_retry
        self.fault = fault
        self._fault_where = False
        if fault is not None:
            try:
                self._fault_where = len(inspect.signature(fault).parameters) >= 2
            except (TypeError, ValueError):
                self._fault_where = False

    def _check_fault(self, rows: int, where: str) -> None:
        if self.fault is None:
            return
        if self._fault_where:
            self.fault(rows, where)
        elif where == "block":  # one-argument hooks only ever targeted block calls
            self.fault(rows)

    def map(self, fn: Callable[[int, int], object], n: int, where: str | None = None,
            detail: str = "") -> list:
        """``[fn(a, b) for consecutive row ranges [a, b) covering 0..n]`` with ranges of at most ``max_rows``
        rows; an out-of-memory error halves ``max_rows`` and retries the failed range (finished ranges are
        kept: every row is independent of the others)."""
        where = where or self.where
        outs, k = [], 0
        while k < n:
            m = min(self.max_rows, n - k)
            try:
                self._check_fault(m, where)
                outs.append(fn(k, k + m))
                k += m
            except Exception as e:  # only out-of-memory is retried
                if not is_oom(e):
                    raise
                free_cached_memory()
                if m == 1:
                    raise DeviceOutOfMemory(
                        f"out of memory even at batch 1 ({where}{detail}): {str(e).splitlines()[0][:160]}; "
                        "try --dtype bfloat16, fewer --tokens, or --device-map auto (spread over several GPUs)"
                    ) from e
                rec = {"where": where, "from": self.max_rows, "to": max(1, m // 2)}
                self.max_rows = rec["to"]
                self.retries.append(rec)
                if self.on_retry is not None:
                    self.on_retry(rec)
        return outs

    def run(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, where: str | None = None) -> torch.Tensor:
        """``fn`` applied to ``x`` in chunks of at most ``max_rows`` rows (dim 0), halving on OOM."""
        outs = self.map(lambda a, b: fn(x[a:b]), x.shape[0], where)
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)


def _to_device(obj, dev: torch.device):
    """Tensors inside ``obj`` (tuples, lists, dicts) moved to ``dev``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, tuple):
        return tuple(_to_device(o, dev) for o in obj)
    if isinstance(obj, list):
        return [_to_device(o, dev) for o in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, dev) for k, v in obj.items()}
    return obj


@dataclass
class Baseline:
    """Cached baseline of one prompt batch: ``states[s]`` is the input of slot s, ``states[L]`` the output of
    the last block (before the final norm); each [P, T, D]."""

    states: list[torch.Tensor]
    slot_args: list[tuple]
    slot_kwargs: list[dict]


class BlockRunner:
    """Runs a model's blocks slot by slot with the calling convention its own forward used.

    The positional and keyword arguments every slot receives (rotary ``position_embeddings``, masks,
    ``position_ids``, ...) are captured once from a real forward with ``use_cache=False``; windows have no
    padding, so these arguments do not depend on the prompt and broadcast over any batch size.

    ``unit`` (:mod:`swapkl.model.units`): what a slot takes from another block.  ``block``: all its weights;
    ``attention`` / ``mlp``: that sublayer unit's weights (norms included), the rest of the slot's own block
    (:func:`~swapkl.model.units.mixed_weights`).  A family without validated sublayers raises
    :class:`~swapkl.model.units.UnsupportedUnit` here, before any forward.
    """

    def __init__(self, model: torch.nn.Module, unit: str = "block"):
        self.model = model
        self.loc = locate(model)
        self.blocks = self.loc.blocks
        self.num_layers = len(self.blocks)
        self.unit = check_unit(unit)
        # the state-dict names of each slot's unit (None for whole blocks: every entry moves)
        self.unit_keys: list[frozenset] | None = None
        if unit != "block":
            layout = layout_for(model, self.loc)
            self.unit_keys = [unit_keys(b, layout, unit) for b in self.blocks]
        # weights of each block, as load_state_dict would copy them (parameters + persistent buffers)
        self.weights = [dict(b.state_dict(keep_vars=True)) for b in self.blocks]
        for s, w in enumerate(self.weights):
            if any(t.device.type == "meta" for t in w.values()):
                raise ModelLoadError(
                    f"layer {s} is offloaded (its weights are on the 'meta' device: device_map put it on cpu/disk "
                    "offload); swapkl needs every layer resident on a device: use more GPUs, --dtype bfloat16, "
                    "or a device_map without cpu/disk offload")
        self._moved: OrderedDict = OrderedDict()  # (block, device) -> weights copied there (multi-device maps)
        self._mixed: dict = {}  # (slot, block, device) -> a slot's weights with another block's unit (references)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    def block_device(self, slot: int) -> torch.device:
        try:
            return next(self.blocks[slot].parameters()).device
        except StopIteration:
            return self.device

    def weights_on(self, block: int, dev: torch.device) -> dict:
        """Block ``block``'s weights on ``dev``: the tensors themselves when they are there already, else a
        copy (a model spread over several devices by a device_map); the last few copies are kept."""
        w = self.weights[block]
        if all(t.device == dev for t in w.values()):
            return w
        key = (block, str(dev))
        if key in self._moved:
            self._moved.move_to_end(key)
            return self._moved[key]
        moved = {k: t.to(dev) for k, t in w.items()}
        self._moved[key] = moved
        while len(self._moved) > 4:
            self._moved.popitem(last=False)
        return moved

    @torch.inference_mode()
    def baseline(self, ids: torch.Tensor, batch: BatchController | None = None) -> Baseline:
        """Run the real model on ``ids`` [P, T], recording every slot's input and the last block's output
        (in chunks of ``batch.max_rows`` prompts; out-of-memory halves the chunk and retries it)."""
        L = self.num_layers
        inputs: list[list[torch.Tensor]] = [[] for _ in range(L + 1)]
        call: dict[int, tuple] = {}

        def pre(slot):
            def hook(mod, args, kwargs):
                h = args[0] if args else kwargs["hidden_states"]
                inputs[slot].append(h.detach())
                if slot not in call:
                    call[slot] = (args, kwargs)
            return hook

        def post(mod, args, out):
            inputs[L].append((out[0] if isinstance(out, tuple) else out).detach())

        handles = [b.register_forward_pre_hook(pre(s), with_kwargs=True) for s, b in enumerate(self.blocks)]
        handles.append(self.blocks[L - 1].register_forward_hook(post))
        backbone = self._backbone()
        dev = self.input_device()
        batch = batch or BatchController(ids.shape[0], where="baseline")

        def run(a: int, b: int) -> None:
            sizes = [len(x) for x in inputs]
            try:
                backbone(input_ids=ids[a:b].to(dev), use_cache=False)
            except BaseException:
                for x, n in zip(inputs, sizes):  # drop what the failed chunk recorded
                    del x[n:]
                raise

        try:
            # one window alone first: the calling convention captured at batch 1 broadcasts to any batch
            batch.map(run, 1, "baseline")
            for x in inputs:
                x.clear()
            batch.map(run, ids.shape[0], "baseline")
        finally:
            for h in handles:
                h.remove()
        states = []
        for k, x in enumerate(inputs):  # one slot at a time, its parts freed as it is joined: never twice over
            states.append(x[0] if len(x) == 1 else torch.cat(x, 0))
            inputs[k] = []
        slot_args, slot_kwargs = [], []
        for s in range(L):
            args, kwargs = call[s]
            sdev = self.block_device(s)
            slot_args.append(_to_device(tuple(args[1:]), sdev))
            slot_kwargs.append(_to_device({k: v for k, v in kwargs.items() if k != "hidden_states"}, sdev))
        return Baseline(states, slot_args, slot_kwargs)

    def head_device(self) -> torch.device:
        """Where the output head's weights are (logits and the KL are computed there)."""
        return next(self.loc.head.parameters()).device

    def input_device(self) -> torch.device:
        emb = self.model.get_input_embeddings()
        return next(emb.parameters()).device

    def _backbone(self) -> torch.nn.Module:
        # the module that owns the block list: run it without the head (no P*T*V logits)
        path = self.loc.family.blocks.rsplit(".", 1)[0]
        mod = self.model
        for part in path.split("."):
            mod = getattr(mod, part)
        return mod

    def slot_weights(self, slot: int, block: int, dev: torch.device) -> dict:
        """The weights slot ``slot`` runs when it takes block ``block``'s unit: all of block ``block``'s for whole
        blocks, else block ``block``'s unit entries and slot ``slot``'s own for the rest (tensors, never copies,
        unless a device_map spreads the model)."""
        if self.unit_keys is None:
            return self.weights_on(block, dev)
        key = (slot, block, str(dev))
        if key in self._mixed:
            return self._mixed[key]
        own, other = self.weights_on(slot, dev), self.weights_on(block, dev)
        mixed = mixed_weights(own, other, self.unit_keys[slot])
        if own is self.weights[slot] and other is self.weights[block]:  # references only: kept for the next call
            self._mixed[key] = mixed
        return mixed

    def run_slot(self, base: Baseline, slot: int, block: int, h: torch.Tensor) -> torch.Tensor:
        """Slot ``slot`` applied to ``h`` [n, T, D] with block ``block``'s unit (:meth:`slot_weights`): the slot's
        own module runs, so its rotary embeddings, ``layer_idx`` and attention type are the slot's."""
        mod = self.blocks[slot]
        dev = self.block_device(slot)
        h = h.to(dev)
        args = (h,) + base.slot_args[slot]
        if block == slot:
            out = mod(*args, **base.slot_kwargs[slot])
        else:
            out = functional_call(mod, self.slot_weights(slot, block, dev), args, base.slot_kwargs[slot])
        return out[0] if isinstance(out, tuple) else out

    def run_slot_float32(self, base: Baseline, slot: int, h: torch.Tensor) -> torch.Tensor:
        """Slot ``slot`` with its own weights upcast to float32 (inputs and slot arguments too): the same
        network computed at higher precision, one block's float32 copy at a time."""
        mod = self.blocks[slot]
        dev = self.block_device(slot)
        args = (_float32(h.to(dev)),) + tuple(_float32(a) for a in base.slot_args[slot])
        kwargs = {k: _float32(v) for k, v in base.slot_kwargs[slot].items()}
        out = functional_call(mod, {k: _float32(v) for k, v in self.weights_on(slot, dev).items()}, args, kwargs)
        return out[0] if isinstance(out, tuple) else out

    def logits_float32(self, h_last: torch.Tensor) -> torch.Tensor:
        """:meth:`logits` with the final norm and head upcast to float32."""
        norm, head = self.loc.final_norm, self.loc.head
        dev = next(head.parameters()).device
        x = functional_call(norm, {k: _float32(v) for k, v in norm.state_dict(keep_vars=True).items()},
                            (_float32(h_last.to(dev)),))
        return functional_call(head, {k: _float32(v) for k, v in head.state_dict(keep_vars=True).items()}, (x,))

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """Final norm + output head on last-block outputs [..., D] -> logits [..., V]."""
        norm_dev = next(self.loc.final_norm.parameters(), torch.empty(0, device=h_last.device)).device
        x = self.loc.final_norm(h_last.to(norm_dev))
        head_dev = next(self.loc.head.parameters()).device
        return self.loc.head(x.to(head_dev))


def _float32(obj):
    """Floating tensors inside ``obj`` (tuples too) as float32; everything else unchanged."""
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() else obj
    if isinstance(obj, tuple):
        return tuple(_float32(o) for o in obj)
    return obj
