"""Running blocks in slots, batched: the baseline residual stream a sweep starts from (:class:`Baseline`), a block run
in another slot under a per-layer definition (:class:`BlockRunner`; :mod:`swapkl.scoring.definitions`: its weights
through the slot's module, or its own module), each with the call the model's forward gave it rebuilt for the rows
at hand (:mod:`swapkl.scoring.calls`), and the batch size that halves on out-of-memory and retries
(:class:`BatchController`).  Used by :mod:`swapkl.scoring.engine`."""
from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from swapkl.model.architectures import locate
from swapkl.model.units import check_unit, layout_for, mixed_weights, unit_keys
from swapkl.errors import ModelLoadError, SwapklError, is_oom
from swapkl.scoring.calls import CallRecorder, SlotCall, StateLayout, state_layout
from swapkl.scoring.definitions import definition, hybrid_block, structure

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

    def run_rows(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor, num_prompts: int,
                 where: str | None = None) -> torch.Tensor:
        """:meth:`run` for ``x`` made of row sets of all ``num_prompts`` prompts: ``fn(part, rows)`` gets each
        part's prompt indices (row r of ``x`` is prompt ``r mod num_prompts``)."""
        def part(a: int, b: int) -> torch.Tensor:
            return fn(x[a:b], torch.arange(a, b) % num_prompts)

        outs = self.map(part, x.shape[0], where)
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
    the last block (before the final norm); each [P, T, D].  ``calls[s]``: what the model's forward passed slot s
    besides the hidden states, rebuilt for any rows (:class:`~swapkl.scoring.calls.SlotCall`)."""

    states: list[torch.Tensor]
    calls: list[SlotCall]


class BlockRunner:
    """Runs a model's blocks slot by slot with the calling convention its own forward used.

    The positional and keyword arguments every slot receives (rotary ``position_embeddings``, masks, ALiBi biases,
    ``position_ids``, per-layer inputs, ...) are recorded from real forwards with ``use_cache=False``
    (:meth:`baseline`) and rebuilt for the rows of each call (:meth:`call`).

    ``unit`` (:mod:`swapkl.model.units`): what a slot takes from another block.  ``block``: all its weights;
    ``attention`` / ``mlp``: that sublayer unit's weights (norms included), the rest of the slot's own block
    (:func:`~swapkl.model.units.mixed_weights`).  A family without validated sublayers raises
    :class:`~swapkl.model.units.UnsupportedUnit` here, before any forward.  ``per_layer``: the definition of a
    block in another slot (:mod:`swapkl.scoring.definitions`: ``slot`` or ``block``).
    """

    def __init__(self, model: torch.nn.Module, unit: str = "block", per_layer: str = "slot"):
        self.model = model
        self.loc = locate(model)
        self.blocks = self.loc.blocks
        self.num_layers = len(self.blocks)
        self.unit = check_unit(unit)
        self.definition = definition(per_layer)
        self.calls: list[SlotCall] = []
        self.layout = StateLayout()
        self.num_prompts = 0
        self._structures: dict = {}
        self._hybrids: dict = {}
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
        (in chunks of ``batch.max_rows`` prompts; out-of-memory halves the chunk and retries it) and every slot's
        call (:class:`~swapkl.scoring.calls.CallRecorder`: first the first prompt alone and twice, then the chunks)."""
        L = self.num_layers
        inputs: list[list[torch.Tensor]] = [[] for _ in range(L + 1)]
        recorder = CallRecorder(L)
        shapes: list = []

        def pre(slot):
            def hook(mod, args, kwargs):
                h = args[0] if args else kwargs["hidden_states"]
                if slot == 0 and len(shapes) < 2:
                    shapes.append(tuple(h.shape))
                    if len(shapes) == 2:
                        self.layout = state_layout(*shapes, ids.shape[1])
                inputs[slot].append(self.layout.rows(h.detach()))
                recorder.record(slot, tuple(args[1:]), {k: v for k, v in kwargs.items() if k != "hidden_states"},
                                keyword=not args)
            return hook

        def post(mod, args, out):
            inputs[L].append(self.layout.rows((out[0] if isinstance(out, (tuple, list)) else out).detach()))

        handles = [b.register_forward_pre_hook(pre(s), with_kwargs=True) for s, b in enumerate(self.blocks)]
        handles.append(self.blocks[L - 1].register_forward_hook(post))
        backbone = self._backbone()
        dev = self.input_device()
        batch = batch or BatchController(ids.shape[0], where="baseline")

        def run(rows: torch.Tensor) -> None:
            sizes, recorded = [len(x) for x in inputs], recorder.sizes()
            try:
                backbone(input_ids=rows.to(dev), use_cache=False)
            except BaseException:
                for x, n in zip(inputs, sizes):  # drop what the failed chunk recorded
                    del x[n:]
                recorder.drop_chunk(recorded)
                raise

        try:
            for name, rows in (("one", ids[:1]), ("two", ids[:1].expand(2, -1))):
                recorder.phase(name)
                batch.map(lambda a, b, r=rows: run(r), 1, "baseline")
                for x in inputs:
                    x.clear()
            recorder.phase("chunk")
            batch.map(lambda a, b: run(ids[a:b]), ids.shape[0], "baseline")
        finally:
            for h in handles:
                h.remove()
        states = []
        for k, x in enumerate(inputs):  # one slot at a time, its parts freed as it is joined: never twice over
            states.append(x[0] if len(x) == 1 else torch.cat(x, 0))
            inputs[k] = []
        self.calls = [c.to(self.block_device(s)) for s, c in enumerate(recorder.finish(ids.shape[0]))]
        self.num_prompts = int(ids.shape[0])
        return Baseline(states, self.calls)

    def call(self, slot: int, rows: torch.Tensor, h: torch.Tensor, dev: torch.device | None = None) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of the call the model's forward gives slot ``slot`` with hidden states ``h``, for rows
        whose prompts are ``rows``, on ``dev`` (default: the slot's device)."""
        call = self.calls[slot]
        args, kwargs = call.build(rows)
        if dev is not None and dev != self.block_device(slot):
            args, kwargs = _to_device(args, dev), _to_device(kwargs, dev)
        return call.arrange(self.layout.model(h.to(dev or self.block_device(slot))), args, kwargs)

    def structure(self, slot: int) -> dict:
        """The structure of slot ``slot``'s unit: ``{name: (shape, dtype)}`` of its weights."""
        if slot not in self._structures:
            keys = None if self.unit_keys is None else self.unit_keys[slot]
            self._structures[slot] = structure(self.weights[slot], keys)
        return self._structures[slot]

    def undefined(self, slot: int, block: int) -> str | None:
        """Why block ``block``'s unit cannot run in slot ``slot`` under this runner's definition, or None."""
        return self.definition.undefined(self, slot, block)

    def hybrid(self, slot: int, block: int) -> torch.nn.Module:
        """Slot ``slot``'s block with block ``block``'s own unit modules (the ``block`` definition of a sublayer)."""
        key = (slot, block)
        if key not in self._hybrids:
            spec = layout_for(self.model, self.loc).spec(self.unit)
            self._hybrids[key] = hybrid_block(self.blocks[slot], self.blocks[block], spec.modules)
        return self._hybrids[key]

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

    def run_slot(self, base: Baseline, slot: int, block: int, h: torch.Tensor,
                 rows: torch.Tensor | None = None) -> torch.Tensor:
        """Slot ``slot`` applied to ``h`` [n, T, D] with block ``block``'s unit under the runner's definition
        (:mod:`swapkl.scoring.definitions`); ``rows``: the prompt of each row (default: row r is prompt r mod P)."""
        if rows is None:
            rows = torch.arange(h.shape[0]) % max(1, self.num_prompts)
        return self.definition.run(self, slot, block, h, rows)

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """The model's output function on last-block outputs [..., D] -> logits [..., V] (final norm + head, or the
        model's own tail: :mod:`swapkl.model.outputs`)."""
        return self.loc.logits(self.layout.model(h_last))


def undefined_moves(runner: BlockRunner, pairs) -> dict:
    """``{(i, j): reason}``: the pairs whose moves (block j's unit in slot i, block i's in slot j) the runner's
    per-layer definition leaves undefined (``slot``: blocks of different structure); no forward runs."""
    out = {}
    for i, j in pairs:
        why = runner.undefined(i, j) or runner.undefined(j, i)
        if why is not None:
            out[(i, j)] = why
    return out
