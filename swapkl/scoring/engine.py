"""The swap-KL sweep: both protocols, both replacement directions, per-prompt KL vectors, in one pass.

Notation (docs/method.md §1): slots 0..L-1; ``M[i<-j]`` runs block j's weights in slot i (replacement, directed);
``M[i<->j]`` exchanges the weights of slots i and j (interchange).  All KLs are ``KL(p_base || p_variant)``
in nats, from float32 log-softmax (float64 when the contract's ``kl_dtype`` asks).

The sweep is exact (no approximation) and uses the speed-ups of docs/method.md §7:

* **prefix reuse** - a variant equals the baseline before its first modified slot, so it starts from the
  cached baseline residual stream ``h[s]`` (input of slot s);
* **shared branch** - ``M[i<-j]`` and ``M[i<->j]`` agree on slots i..j-1: one row set runs them and forks
  at slot j;
* **batching** - every prompt is in one tensor, and at each slot all row sets that run the same block are
  concatenated into one call (so the unmodified suffixes of many variants run together);
* **head only where scored**, float32 KL chunked over prompts so P*T*V log-probs never exist at once, through
  the KL implementation of :mod:`swapkl.scoring.kl` the engine was given (``kl_impl``; fused on a GPU).

What runs when a block is in another slot is the contract's per-layer definition (:mod:`swapkl.scoring.definitions`):
``slot`` (default) runs the slot's own module (so slot-dependent behaviour - rotary embeddings, ``layer_idx``,
per-slot attention type or scaling - is the slot's) with the other block's tensors (``torch.func.functional_call``),
which equals copying the weights in (the paper's scripts) without copying, and is undefined for a pair of blocks of
different structure (:meth:`SwapEngine.undefined`: such pairs are left out, with their reason); ``block`` runs the
other block's own module with its own call.  Each call groups only row sets that run the same block in the same
slot, so blocks of different structure never share a call.

**Units** (``unit``, docs/method.md "Sublayer units"): for ``attention`` or ``mlp`` the same sweep moves only that
sublayer unit (its module and its norms): ``M[i<-j]`` runs slot i's block with unit j's weights, ``M[i<->j]`` gives
slot i block i with unit j and slot j block j with unit i.  Nothing else changes - the variants still first differ
from the baseline at slot i (prefix reuse), the two protocols still share slots i..j-1, and the block calls are the
same calls with other tensors - so a sublayer sweep costs what a block sweep of the same pairs costs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch.func import functional_call

from swapkl.errors import ComputeInterrupted
from swapkl.model.block_io import hidden_of
from swapkl.model.handed import handed_form
from swapkl.scoring.headkl import HeadKL
from swapkl.scoring.kl import KLFunction, base_distribution, kl_from_logits, kl_rows  # noqa: F401
from swapkl.scoring.slots import (BatchController, BlockRunner, DeviceOutOfMemory, PairFn,
                                  ProgressFn, run_row_sets, undefined_moves)

ChunkFn = Callable[[dict], None]


@dataclass
class _Rows:
    """A set of prompts rows [P, T, D] travelling through the stack for one variant (or a shared branch)."""

    h: torch.Tensor
    slot: int
    label: tuple  # ("shared", i, j) | ("repl", slot, block) | ("inter", i, j)
    overrides: dict[int, int] = field(default_factory=dict)
    fork_at: int | None = None
    handed: tuple | None = None  # what the block before handed on ([P, ...] or None per channel); None: no channels


def _slot_of(label: tuple) -> tuple[tuple[int, int], str]:
    """A finished variant's pair and its name in the pair's vectors: ``repl_ij``, ``repl_ji`` or ``inter``."""
    kind, a, b = label
    key = (min(a, b), max(a, b))
    return key, "inter" if kind == "inter" else ("repl_ij" if a < b else "repl_ji")


@dataclass
class SweepStats:
    block_calls: int = 0          # prompt-block evaluations (rows x blocks) actually run by the sweep
    naive_block_calls: int = 0    # what 1+3|S| full forwards per prompt would run
    baseline_block_calls: int = 0  # rows x blocks of the baseline pass
    head_positions: int = 0       # positions through the final norm + head (baseline and variants)
    variants: int = 0
    seconds: float = 0.0
    kl_seconds: float = 0.0       # in the KL function itself (only with ``timing``: synchronised)
    head_kl_seconds: float = 0.0  # in the head + KL of the variants (only with ``timing``)
    oom_retries: list = field(default_factory=list)


class SwapEngine:
    """Computes per-prompt swap-KL vectors for a list of pairs.

    ``positions``: ``"all"`` (mean over the T positions of each window) or ``"last"``.
    ``max_rows``: the largest number of prompt rows in one block call (halved on out-of-memory).
    ``max_live``: how many variant row sets may be alive at once (bounds memory to about
    ``max_live * P * T * D`` activations); pairs are processed in chunks of ``max_live // 3``; an
    out-of-memory error that persists at one row halves the chunk and redoes it.
    ``kl_chunk_rows``: prompts per head + float32 KL call (each holds a few ``[rows, T, V]`` float32
    tensors; never ``P * T * V`` at once); halved on out-of-memory.
    ``logp_budget``: bytes allowed for cached baseline log-probs; above it they are recomputed per KL chunk
    (once per chunk of pairs, shared by all its variants).
    ``fault``: test hook, see :class:`BatchController`.  ``on_oom(record)``: called at each halving.
    ``unit``: ``block`` (default), ``attention`` or ``mlp``: what each protocol moves (:class:`BlockRunner`).
    ``per_layer``: ``slot`` (default) or ``block``, the definition of a block in another slot.
    """

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, positions: str = "all",
                 max_rows: int = 64, max_live: int = 48, kl_chunk_rows: int | None = None,
                 logp_budget: int = 512 * 2**20, fault: Callable | None = None,
                 on_oom: Callable[[dict], None] | None = None, kl_dtype: torch.dtype = torch.float32,
                 kl_impl: str = "auto", timing: bool = False, unit: str = "block", per_layer: str = "slot"):
        if positions not in ("all", "last"):
            raise ValueError(positions)
        if kl_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"kl_dtype must be float32 or float64, got {kl_dtype}")
        self.kl_dtype = kl_dtype
        self.runner = BlockRunner(model, unit, per_layer)
        self.ids = ids
        self.positions = positions
        self.stats = SweepStats()
        retries = self.stats.oom_retries
        self.batch = BatchController(max_rows, fault=fault, where="block", on_retry=on_oom, retries=retries)
        self.max_live = max(3, max_live)
        kl_batch = BatchController(1, fault=fault, where="kl", on_retry=on_oom, retries=retries)
        self.head = HeadKL(self.runner, positions, kl_dtype, KLFunction(kl_impl, self.runner.head_device()),
                           kl_batch, self.stats, timing)
        P, T = ids.shape
        kl_batch.max_rows = kl_chunk_rows or self.head.default_chunk_rows(T)
        t0 = time.perf_counter()
        self.base = self.runner.baseline(ids, self.batch)
        self.stats.baseline_block_calls += P * self.num_layers
        self.stats.seconds += time.perf_counter() - t0
        self.head.start(self.base, P, T, logp_budget)

    @property
    def num_layers(self) -> int:
        return self.runner.num_layers

    def undefined(self, pairs: Iterable[tuple[int, int]]) -> dict:
        """``{(i, j): reason}`` for the pairs the engine's per-layer definition leaves undefined (block j's unit in
        slot i or block i's in slot j cannot run); :meth:`sweep` refuses them."""
        return undefined_moves(self.runner, pairs)

    def sweep(self, pairs: Iterable[tuple[int, int]], progress: ProgressFn | None = None,
              on_pair: PairFn | None = None, should_stop: Callable[[], bool] | None = None,
              on_chunk: ChunkFn | None = None) -> dict:
        """Compute every pair.  Returns ``{(i, j): {"repl_ij": [P], "repl_ji": [P], "inter": [P]}}`` where
        ``repl_ij`` is KL of ``M[i<-j]`` (slot i runs block j), ``repl_ji`` of ``M[j<-i]``, ``inter`` of
        ``M[i<->j]``; float32 CPU tensors, nats.  ``on_pair(i, j, vectors)`` is called as each pair
        completes (in order of gap, adjacent first); ``on_chunk({(i, j): vectors})`` once per chunk of pairs
        (every pair of a chunk finishes at once: one durable cache write per chunk); ``should_stop()`` is polled
        between chunks and raises :class:`ComputeInterrupted` (finished pairs were already handed on)."""
        pairs = list(pairs)
        L = self.num_layers
        for i, j in pairs:
            if not (0 <= i < j < L):
                raise ValueError(f"bad pair ({i}, {j}) for {L} layers")
        bad = self.undefined(pairs)
        if bad:
            (i, j), why = next(iter(bad.items()))
            raise ValueError(f"pair ({i}, {j}) is undefined: {why}")
        total = 3 * len(pairs)
        done = 0
        results: dict = {}
        chunk = max(1, self.max_live // 3)
        P = self.ids.shape[0]
        c = 0
        while c < len(pairs):
            if should_stop is not None and should_stop():
                raise ComputeInterrupted(f"stopped after {done // 3} of {len(pairs)} pairs")
            part = pairs[c:c + chunk]
            t0 = time.perf_counter()
            rows_before = self.batch.max_rows
            try:
                finished = self._sweep_chunk(part)
            except DeviceOutOfMemory:
                if len(part) == 1:
                    raise
                # too many variants alive at once: halve the chunk of pairs (the controller records it) and redo it
                chunk = self.batch.halve_group(len(part))
                self.max_live = max(3, 3 * chunk)
                self.batch.max_rows = rows_before
                continue
            c += len(part)
            for label, vec in finished:
                key, slot_name = _slot_of(label)
                results.setdefault(key, {})[slot_name] = vec
            if on_chunk is not None:  # on disk before anyone is told
                on_chunk({p: results[p] for p in part})
            told: dict = {}
            for label, _vec in finished:
                key, _ = _slot_of(label)
                told[key] = told.get(key, 0) + 1
                done += 1
                self.stats.variants += 1
                if progress is not None:
                    kind = label[0]
                    progress(done, total, f"{kind} {label[1]}{'<->' if kind == 'inter' else '<-'}{label[2]}")
                if told[key] == 3 and on_pair is not None:
                    on_pair(key[0], key[1], results[key])
            self.stats.seconds += time.perf_counter() - t0
        self.stats.naive_block_calls += P * L * 3 * len(pairs)
        return results

    @torch.inference_mode()
    def _sweep_chunk(self, pairs: list[tuple[int, int]]) -> list[tuple[tuple, torch.Tensor]]:
        """Slot-by-slot sweep over the variants of ``pairs``; returns [(label, per-prompt KL)]."""
        L = self.num_layers
        states, handed = self.base.states, self.base.handed or [None] * L
        live: list[_Rows] = []
        calls = 0
        for s in range(L):
            # variants whose first modified slot is s start from the cached baseline
            for i, j in pairs:
                if i == s:
                    live.append(_Rows(states[i], i, ("shared", i, j), {i: j}, fork_at=j, handed=handed[i]))
                if j == s:
                    live.append(_Rows(states[j], j, ("repl", j, i), {j: i}, handed=handed[j]))
            # a shared branch reaching its fork splits into M[i<-j] and M[i<->j]
            forked = []
            for r in live:
                if r.fork_at == s:
                    _, i, j = r.label
                    forked.append(_Rows(r.h, s, ("repl", i, j), handed=r.handed))
                    forked.append(_Rows(r.h, s, ("inter", i, j), {j: i}, handed=r.handed))
                else:
                    forked.append(r)
            live = forked
            # group by the block each row set runs at this slot (and, with handed-on states, by their form: only
            # row sets whose states join into one tensor share a call); one batched call per group
            groups: dict = {}
            for r in live:
                block = r.overrides.get(s, s)
                groups.setdefault(block if r.handed is None else (block, handed_form(r.handed)), []).append(r)
            for key, rows in groups.items():
                block = key if rows[0].handed is None else key[0]
                hs, given, n = run_row_sets(self.runner, self.batch, s, block, [r.h for r in rows],
                                            None if rows[0].handed is None else [r.handed for r in rows],
                                            self.ids.shape[0])
                for k, r in enumerate(rows):
                    r.h = hs[k]
                    if given is not None:
                        r.handed = given[k]
                calls += n
                del hs
        kls = self.head.kl_many([self.runner.final_state(r.h, r.handed) for r in live])
        self.stats.block_calls += calls
        return [(r.label, v) for r, v in zip(live, kls)]


# ------------------------------------------------------------------------------------------------ diagnostics
@torch.inference_mode()
def noise_floor(engine: SwapEngine, n: int = 2) -> float:
    """Mean KL (nats) between ``engine``'s batched baseline and batch-of-one full forwards of the model
    on the first ``n`` prompts: differences below this are numerical noise, not signal."""
    vals = []
    for k in range(min(n, engine.ids.shape[0])):
        out = engine.runner.model(input_ids=engine.ids[k:k + 1].to(engine.runner.input_device()), use_cache=False)
        logits = engine.head.scored(out.logits)
        lb = engine.head.base_logp(k, k + 1).to(logits.device)
        vals.append(kl_rows(lb, logits).mean().item())
        del out, logits
    return float(sum(vals) / max(1, len(vals)))

@torch.inference_mode()
def precision_floor(engine: SwapEngine, n: int = 2) -> float:
    """Mean KL (nats) between the baseline as computed (e.g. bf16) and the same weights computed in float32,
    on the first ``n`` prompts: the size of the model's own arithmetic noise at this dtype (an estimate:
    the slot arguments, e.g. rotary cos/sin, stay as captured).  0 for a float32 model."""
    if engine.runner.dtype == torch.float32:
        return 0.0
    n = min(n, engine.ids.shape[0])
    h = engine.base.states[0][:n]
    for s in range(engine.num_layers):
        h = _slot_float32(engine.runner, s, h)
    logits = _logits_float32(engine.runner, engine.head.scored(h))
    lb = engine.head.base_logp(0, n).to(logits.device)
    return float(kl_rows(lb, logits).mean().item())


def _slot_float32(runner: BlockRunner, slot: int, h: torch.Tensor) -> torch.Tensor:
    """Slot ``slot`` with its own weights upcast to float32 (inputs and slot arguments too): the same network
    computed at higher precision, one block's float32 copy at a time."""
    mod = runner.blocks[slot]
    dev = runner.block_device(slot)
    args, kwargs = runner.call(slot, torch.arange(h.shape[0]) % max(1, runner.recording.num_prompts), _float32(h), dev)
    args = tuple(_float32(a) for a in args)
    kwargs = {k: _float32(v) for k, v in kwargs.items()}
    out = functional_call(mod, {k: _float32(v) for k, v in runner.unit_weights.on(slot, dev).items()}, args, kwargs)
    return runner.recording.layout.rows(hidden_of(out))


def _logits_float32(runner: BlockRunner, h_last: torch.Tensor) -> torch.Tensor:
    """The runner's logits with the final norm and head upcast to float32 (a model whose output function is its own
    tail computes it in its dtype from the float32 state)."""
    norm, head = runner.loc.final_norm, runner.loc.head
    if runner.loc.family.output != "head":
        return runner.logits(h_last.to(runner.dtype)).float()
    dev = next(head.parameters()).device
    x = functional_call(norm, {k: _float32(v) for k, v in norm.state_dict(keep_vars=True).items()},
                        (_float32(h_last.to(dev)),))
    return functional_call(head, {k: _float32(v) for k, v in head.state_dict(keep_vars=True).items()}, (x,))


def _float32(obj):
    """Floating tensors inside ``obj`` (tuples too) as float32; everything else unchanged."""
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() else obj
    if isinstance(obj, tuple):
        return tuple(_float32(o) for o in obj)
    return obj
