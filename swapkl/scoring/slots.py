"""Running blocks in slots, batched: the baseline residual stream a sweep starts from (:class:`Baseline`), a block run
in another slot under a per-layer definition (:class:`BlockRunner`; :mod:`swapkl.scoring.definitions`: its weights
through the slot's module, or its own module), each with the call the model's forward gave it rebuilt for the rows
at hand (:mod:`swapkl.scoring.calls`), with the batch size that halves on out-of-memory and retries
(:mod:`swapkl.scoring.batching`).  A state the blocks hand on to each other besides the hidden states
(:mod:`swapkl.model.handed`) is carried beside them (:meth:`BlockRunner.run_handed`).  Used by :mod:`swapkl.scoring.engine`."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.func import functional_call

from swapkl.model.architectures import locate
from swapkl.model.block_io import call_args, hidden_in, hidden_of
from swapkl.model.handed import handed_out, join_handed, joined_state, split_handed
from swapkl.model.units import check_unit, layout_for, unit_keys
from swapkl.scoring.batching import BatchController, DeviceOutOfMemory, free_cached_memory  # noqa: F401 (re-exported)
from swapkl.scoring.calls import CallRecorder, StateLayout, state_layout
from swapkl.scoring.definitions import definition, hybrid_block
from swapkl.scoring.weights import UnitWeights

ProgressFn = Callable[[int, int, str], None]
PairFn = Callable[[int, int, dict], None]


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
    the last block (before the final norm; :meth:`BlockRunner.final_state`); each [P, T, D].  (What the model's
    forward passed each slot besides the hidden states stays with the runner, which rebuilds it per call.)"""

    states: list[torch.Tensor]
    #: per slot, what the block before handed on (one [P, ...] tensor or None per channel); empty without channels
    handed: list[tuple] = field(default_factory=list)
    #: the model's calling convention as this forward showed it (:class:`Recording`)
    recording: Recording | None = None


@dataclass(frozen=True)
class Recording:
    """What one real forward told the runner about the model's own calling convention, recorded once by
    :meth:`BlockRunner.baseline` and never changed after: ``calls[s]``, what the forward passed slot s besides the
    hidden states (rebuilt for any rows, :class:`~swapkl.scoring.calls.SlotCall`); ``num_prompts`` P; ``channels``,
    the states handed on from block to block (:mod:`swapkl.model.handed`); ``layout``, where the batch and the tokens
    sit in the hidden state; ``first``, the first prompt's input of slot 0 [1, T, D] where there are channels (the
    probe of a move that needs a handed-on state), else None."""

    calls: tuple = ()
    num_prompts: int = 0
    channels: tuple = ()
    layout: StateLayout = field(default_factory=StateLayout)
    first: torch.Tensor | None = None


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
        self.recording = Recording()  # replaced, whole, by baseline()
        self._starts: dict = {}  # (slot, block) -> why the block cannot start there (handed-on states), or None
        self.join = self.loc.family.state_join  # what the output function reads besides the last hidden states
        self._hybrids: dict = {}
        # the state-dict names of each slot's unit (None for whole blocks: every entry moves)
        keys = None
        if unit != "block":
            layout = layout_for(model, self.loc)
            keys = [unit_keys(b, layout, unit) for b in self.blocks]
        self.unit_weights = UnitWeights(self.blocks, keys)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    def block_device(self, slot: int) -> torch.device:
        try:
            return next(self.blocks[slot].parameters()).device
        except StopIteration:
            return self.device

    @torch.inference_mode()
    def baseline(self, ids: torch.Tensor, batch: BatchController | None = None) -> Baseline:
        """Run the real model on ``ids`` [P, T], recording every slot's input and the last block's output
        (in chunks of ``batch.max_rows`` prompts; out-of-memory halves the chunk and retries it) and every slot's
        call (:class:`~swapkl.scoring.calls.CallRecorder`: first the first prompt alone and twice, then the chunks)."""
        states, recorder, layout = _record(self, ids, batch or BatchController(ids.shape[0], where="baseline"))
        calls = tuple(c.to(self.block_device(s)) for s, c in enumerate(recorder.finish(ids.shape[0])))
        channels = recorder.channels
        self.recording = Recording(calls, int(ids.shape[0]), channels, layout, states[0][:1] if channels else None)
        self._starts = {}
        handed = [c.handed_values(torch.arange(ids.shape[0])) for c in calls] if channels else []
        return Baseline(states, handed, self.recording)

    def call(self, slot: int, rows: torch.Tensor, h: torch.Tensor, dev: torch.device | None = None,
             handed: tuple | None = None) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of the call the model's forward gives slot ``slot`` with hidden states ``h``, for rows
        whose prompts are ``rows``, on ``dev`` (default: the slot's device); ``handed``: the values of the handed-on
        channels for these rows (None: the baseline's)."""
        call = self.recording.calls[slot]
        dev = dev or self.block_device(slot)
        if handed is not None:
            handed = tuple(v.to(dev) if isinstance(v, torch.Tensor) else v for v in handed)
        args, kwargs = call.build(rows, handed)
        if dev != self.block_device(slot):
            args, kwargs = _to_device(args, dev), _to_device(kwargs, dev)
        return call.arrange(self.recording.layout.model(h.to(dev)), args, kwargs)

    def undefined(self, slot: int, block: int) -> str | None:
        """Why block ``block``'s unit cannot run in slot ``slot`` under this runner's definition, or None."""
        return self.definition.undefined(self.unit_weights.structure, slot, block, self.unit) or self.cannot_start(slot, block)

    @torch.inference_mode()
    def cannot_start(self, slot: int, block: int) -> str | None:
        """Why block ``block``'s unit cannot run in slot 0 of a model with handed-on states: it needs a state that
        only a block before it hands on (a DSA layer that reuses the previous layer's top-k), and none runs before
        slot 0; found by running it there on the first prompt.  None elsewhere (every block hands its states on)."""
        if not self.recording.channels or slot != 0 or block == slot:
            return None
        if (slot, block) not in self._starts:
            why = None
            try:
                first = torch.zeros(1, dtype=torch.long)
                self.run(slot, block, self.recording.first, first, self.recording.calls[slot].handed_values(first))
            except Exception as e:  # the model's own refusal, reported as the reason
                line = (str(e).strip().splitlines() or [""])[0][:160]
                why = (f"block {block}'s unit cannot run in slot {slot}: it needs a state that only a block before it "
                       f"hands on, and none runs before slot {slot} ({type(e).__name__}: {line})")
            self._starts[(slot, block)] = why
        return self._starts[(slot, block)]

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

    def run(self, slot: int, block: int, h: torch.Tensor, rows: torch.Tensor, handed: tuple | None = None):
        """The block's output (as the module returns it) when slot ``slot`` takes block ``block``'s unit, for hidden
        states ``h`` [n, T, D] of prompts ``rows`` [n]: the definition's :class:`~swapkl.scoring.definitions.Placement`
        executed; ``handed``: the handed-on channels' values for these rows (None: the baseline's)."""
        p = self.definition.placement(slot, block, self.unit)
        dev = self.block_device(p.module)
        mod = self.blocks[p.module] if p.hybrid_of is None else self.hybrid(p.module, p.hybrid_of)
        args, kwargs = self.call(p.caller, rows, h, dev, handed)
        if p.weights_of is None:
            return mod(*args, **kwargs)
        return functional_call(mod, self.unit_weights.for_slot(p.module, p.weights_of, dev), args, kwargs)

    def run_slot(self, slot: int, block: int, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Slot ``slot`` applied to ``h`` [n, T, D] with block ``block``'s unit under the runner's definition
        (:mod:`swapkl.scoring.definitions`); ``rows``: the prompt of each row (default: row r is prompt r mod P)."""
        if rows is None:
            rows = torch.arange(h.shape[0]) % max(1, self.recording.num_prompts)
        return self.recording.layout.rows(hidden_of(self.run(slot, block, h, rows)))

    def final_state(self, h: torch.Tensor, handed: tuple | None) -> torch.Tensor:
        """What the output function reads of a last block's hidden states ``h`` [n, T, D] and handed-on states: ``h``,
        or both joined along the width where the model's output reads both (``Family.state_join``: Reformer)."""
        return joined_state(h, handed, self.join) if self.join else h

    def run_handed(self, slot: int, block: int, h: torch.Tensor, rows: torch.Tensor,
                   handed: tuple) -> tuple[torch.Tensor, tuple]:
        """:meth:`run_slot` on a model with handed-on channels: slot ``slot`` runs block ``block``'s unit on ``h``
        [n, T, D] given ``handed`` (what the block run in the slot before handed on: one [n, ...] tensor or None per
        channel); returns ``(hidden states [n, T, D], what it hands on)``."""
        out = self.run(slot, block, h, rows, handed)
        return self.recording.layout.rows(hidden_of(out)), handed_out(out, self.recording.channels)

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """The model's output function on last-block outputs [..., D] -> logits [..., V] (final norm + head, or the
        model's own tail: :mod:`swapkl.model.outputs`)."""
        return self.loc.logits(self.recording.layout.model(h_last))


def _backbone(runner: BlockRunner) -> torch.nn.Module:
    """The innermost module above the block list that takes token ids (the one that owns the list, or, where that one
    takes hidden states as Reformer's encoder does, the first above it): run without the head (no P*T*V logits)."""
    mods = [runner.model]
    for part in runner.loc.family.blocks.split(".")[:-1]:
        mods.append(getattr(mods[-1], part))
    for mod in reversed(mods):
        params = inspect.signature(mod.forward).parameters
        if "input_ids" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return mod
    return runner.model


@torch.inference_mode()
def _record(runner: BlockRunner, ids: torch.Tensor,
            batch: BatchController) -> tuple[list[torch.Tensor], CallRecorder, StateLayout]:
    """``(states, recorder, layout)`` of :meth:`BlockRunner.baseline`: every slot's input and the last block's output
    [P, T, D], the calls recorded (not yet finished) and the state layout read off the first two probes (kept here,
    not on the runner, until the recording is whole)."""
    L = runner.num_layers
    inputs: list[list[torch.Tensor]] = [[] for _ in range(L + 1)]
    recorder = CallRecorder(L)
    shapes: list = []
    found = {"layout": StateLayout()}

    def pre(slot):
        def hook(mod, args, kwargs):
            h = hidden_in(args, kwargs)
            if slot == 0 and len(shapes) < 2:
                shapes.append(tuple(h.shape))
                if len(shapes) == 2:
                    found["layout"] = state_layout(*shapes, ids.shape[1])
            inputs[slot].append(found["layout"].rows(h.detach()))
            recorder.record(slot, *call_args(args, kwargs), keyword=not args)
        return hook

    def post(slot):
        def hook(mod, args, out):
            recorder.output(slot, out)
            if slot == L - 1:
                handed = handed_out(out, recorder.channels) if runner.join else None
                inputs[L].append(runner.final_state(found["layout"].rows(hidden_of(out).detach()), handed))
        return hook

    handles = [b.register_forward_pre_hook(pre(s), with_kwargs=True) for s, b in enumerate(runner.blocks)]
    handles += [b.register_forward_hook(post(s)) for s, b in enumerate(runner.blocks)]
    backbone = _backbone(runner)
    dev = runner.input_device()

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
    return states, recorder, found["layout"]


def run_rows_handed(runner: BlockRunner, batch: BatchController, slot: int, block: int, x: torch.Tensor,
                    handed: tuple) -> tuple[torch.Tensor, tuple]:
    """Slot ``slot`` running block ``block``'s unit on row sets of all prompts ``x`` [n, T, D] (row r is prompt
    r mod P) given the handed-on states ``handed`` (one [n, ...] tensor or None per channel), in parts of at most
    ``batch.max_rows`` rows, halved on out-of-memory: ``(hidden states [n, T, D], what the block hands on)``."""
    P = max(1, runner.recording.num_prompts)

    def part(a: int, b: int):
        return runner.run_handed(slot, block, x[a:b], torch.arange(a, b) % P,
                                 tuple(v[a:b] if v is not None else None for v in handed))

    outs = batch.map(part, x.shape[0], "block")
    if len(outs) == 1:
        return outs[0]
    return torch.cat([o[0] for o in outs], 0), join_handed([o[1] for o in outs])


def run_row_sets(runner: BlockRunner, batch: BatchController, slot: int, block: int, states: list[torch.Tensor],
                 handed: list | None, num_prompts: int) -> tuple[list[torch.Tensor], list | None, int]:
    """The one step both prefix sweeps take at a slot (the engine's swap variants, the bridged sweep's spans): slot
    ``slot`` runs block ``block``'s unit on several row sets of all prompts at once, concatenated into one batched
    call (parts of at most ``batch.max_rows`` rows, halved on out-of-memory), the result split back per set.

    ``states``: each set's hidden states [n_k, T, D] (row r is prompt r mod ``num_prompts``); ``handed``: each set's
    handed-on states (one tuple per set, joinable: :func:`~swapkl.model.handed.handed_form` alike), or None where the
    model hands none on.  Returns ``(new states per set, new handed-on states per set or None, rows run)``."""
    x = states[0] if len(states) == 1 else torch.cat(states, 0)
    sizes = [h.shape[0] for h in states]
    given = None
    if handed is None:
        y = batch.run_rows(lambda part, rows: runner.run_slot(slot, block, part, rows), x, num_prompts, "block")
    else:
        y, joined = run_rows_handed(runner, batch, slot, block, x, join_handed(handed))
        given = split_handed(joined, sizes)
    out, off = [], 0
    for n in sizes:
        out.append(y[off:off + n])
        off += n
    return out, given, x.shape[0]


def undefined_moves(runner: BlockRunner, pairs) -> dict:
    """``{(i, j): reason}``: the pairs whose moves (block j's unit in slot i, block i's in slot j) the runner's
    per-layer definition leaves undefined (``slot``: blocks of different structure); no forward runs."""
    out = {}
    for i, j in pairs:
        why = runner.undefined(i, j) or runner.undefined(j, i)
        if why is not None:
            out[(i, j)] = why
    return out
