"""The swap-KL sweep: both protocols, both replacement directions, per-prompt KL vectors, in one pass.

Notation (METHOD §1): slots 0..L-1; ``M[i<-j]`` runs block j's weights in slot i (replacement, directed);
``M[i<->j]`` exchanges the weights of slots i and j (interchange).  All KLs are ``KL(p_base || p_variant)``
in nats, from float32 log-softmax.

The sweep is exact (no approximation) and uses the speed-ups of METHOD §7:

* **prefix reuse** - a variant equals the baseline before its first modified slot, so it starts from the
  cached baseline residual stream ``h[s]`` (input of slot s);
* **shared branch** - ``M[i<-j]`` and ``M[i<->j]`` agree on slots i..j-1: one row set runs them and forks
  at slot j;
* **batching** - every prompt is in one tensor, and at each slot all row sets that run the same block are
  concatenated into one call (so the unmodified suffixes of many variants run together);
* **head only where scored**, float32 KL chunked over prompts so P*T*V log-probs never exist at once.

A block runs in a slot through the slot's own module (so slot-dependent behaviour - rotary embeddings,
``layer_idx``, per-slot attention type or scaling - is the slot's) with the other block's tensors
(``torch.func.functional_call``), which equals copying the weights in (the paper's scripts) without copying.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch.func import functional_call

from swapkl.architectures import locate
from swapkl.errors import ComputeInterrupted

ProgressFn = Callable[[int, int, str], None]
PairFn = Callable[[int, int, dict], None]


def is_oom(err: BaseException) -> bool:
    """True for a CUDA/CPU out-of-memory error (the kind a smaller batch can fix)."""
    if isinstance(err, getattr(torch, "OutOfMemoryError", ())):
        return True
    if isinstance(err, torch.cuda.OutOfMemoryError if hasattr(torch.cuda, "OutOfMemoryError") else ()):
        return True
    msg = str(err)
    return isinstance(err, (RuntimeError, MemoryError)) and (
        "out of memory" in msg.lower() or isinstance(err, MemoryError)
    )


class BatchController:
    """Holds the current maximum batch (rows of prompts per block call) and halves it on out-of-memory.

    ``retries`` records every halving as (old, new) so callers can report it.  ``fault`` is a test hook:
    a callable(rows) that may raise to simulate an out-of-memory error.
    """

    def __init__(self, max_rows: int, fault: Callable[[int], None] | None = None):
        self.max_rows = max(1, int(max_rows))
        self.retries: list[tuple[int, int]] = []
        self.fault = fault

    def run(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``fn`` applied to ``x`` in chunks of at most ``max_rows`` rows (dim 0), halving on OOM."""
        while True:
            try:
                outs = []
                for k in range(0, x.shape[0], self.max_rows):
                    part = x[k:k + self.max_rows]
                    if self.fault is not None:
                        self.fault(part.shape[0])
                    outs.append(fn(part))
                return outs[0] if len(outs) == 1 else torch.cat(outs, 0)
            except Exception as e:  # noqa: BLE001 - only OOM is retried
                if not is_oom(e) or self.max_rows == 1:
                    raise
                old = self.max_rows
                self.max_rows = max(1, old // 2)
                self.retries.append((old, self.max_rows))
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()


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
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.loc = locate(model)
        self.blocks = self.loc.blocks
        self.num_layers = len(self.blocks)
        # weights of each block, as load_state_dict would copy them (parameters + persistent buffers)
        self.weights = [dict(b.state_dict(keep_vars=True)) for b in self.blocks]
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    def block_device(self, slot: int) -> torch.device:
        try:
            return next(self.blocks[slot].parameters()).device
        except StopIteration:
            return self.device

    @torch.inference_mode()
    def baseline(self, ids: torch.Tensor, batch: BatchController | None = None) -> Baseline:
        """Run the real model on ``ids`` [P, T], recording every slot's input and the last block's output."""
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
        try:
            # one window alone first: the calling convention captured at batch 1 broadcasts to any batch
            backbone(input_ids=ids[:1].to(dev), use_cache=False)
            for x in inputs:
                x.clear()
            step = batch.max_rows if batch else ids.shape[0]
            for k in range(0, ids.shape[0], step):
                backbone(input_ids=ids[k:k + step].to(dev), use_cache=False)
        finally:
            for h in handles:
                h.remove()
        states = [torch.cat(x, 0) for x in inputs]
        slot_args, slot_kwargs = [], []
        for s in range(L):
            args, kwargs = call[s]
            slot_args.append(tuple(args[1:]))
            slot_kwargs.append({k: v for k, v in kwargs.items() if k != "hidden_states"})
        return Baseline(states, slot_args, slot_kwargs)

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

    def run_slot(self, base: Baseline, slot: int, block: int, h: torch.Tensor) -> torch.Tensor:
        """Slot ``slot`` applied to ``h`` [n, T, D] with the weights of block ``block``."""
        mod = self.blocks[slot]
        h = h.to(self.block_device(slot))
        args = (h,) + base.slot_args[slot]
        if block == slot:
            out = mod(*args, **base.slot_kwargs[slot])
        else:
            out = functional_call(mod, self.weights[block], args, base.slot_kwargs[slot])
        return out[0] if isinstance(out, tuple) else out

    def logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """Final norm + output head on last-block outputs [..., D] -> logits [..., V]."""
        norm_dev = next(self.loc.final_norm.parameters(), torch.empty(0, device=h_last.device)).device
        x = self.loc.final_norm(h_last.to(norm_dev))
        head_dev = next(self.loc.head.parameters()).device
        return self.loc.head(x.to(head_dev))


def kl_rows(logp_base: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(base || variant) per position: ``logp_base`` float32 log-probs [..., V], ``logits`` [..., V] ->
    [...] in nats (float32)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return (logp_base.exp() * (logp_base - logp)).sum(-1)


@dataclass
class _Rows:
    """A set of prompts rows [P, T, D] travelling through the stack for one variant (or a shared branch)."""

    h: torch.Tensor
    slot: int
    label: tuple  # ("shared", i, j) | ("repl", slot, block) | ("inter", i, j)
    overrides: dict[int, int] = field(default_factory=dict)
    fork_at: int | None = None


@dataclass
class SweepStats:
    block_calls: int = 0          # prompt-block evaluations (rows x blocks) actually run
    naive_block_calls: int = 0    # what 1+3|S| full forwards per prompt would run
    variants: int = 0
    seconds: float = 0.0
    oom_retries: list = field(default_factory=list)


class SwapEngine:
    """Computes per-prompt swap-KL vectors for a list of pairs.

    ``positions``: ``"all"`` (mean over the T positions of each window) or ``"last"``.
    ``max_rows``: the largest number of prompt rows in one block call (halved on out-of-memory).
    ``max_live``: how many variant row sets may be alive at once (bounds memory to about
    ``max_live * P * T * D`` activations); pairs are processed in chunks of ``max_live // 3``.
    ``logp_budget``: bytes allowed for cached baseline log-probs; above it they are recomputed per chunk.
    """

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, positions: str = "all",
                 max_rows: int = 64, max_live: int = 48, kl_chunk_rows: int | None = None,
                 logp_budget: int = 512 * 2**20, fault: Callable[[int], None] | None = None):
        if positions not in ("all", "last"):
            raise ValueError(positions)
        self.runner = BlockRunner(model)
        self.ids = ids
        self.positions = positions
        self.batch = BatchController(max_rows, fault=fault)
        self.max_live = max(3, max_live)
        self.stats = SweepStats()
        V = self._vocab()
        P, T = ids.shape
        Ts = T if positions == "all" else 1
        # rows per KL chunk: keep two [rows, Ts, V] float32 tensors under ~256 MB
        self.kl_chunk_rows = kl_chunk_rows or max(1, int(256 * 2**20 // (8 * Ts * V)))
        t0 = time.perf_counter()
        self.base = self.runner.baseline(ids, self.batch)
        self.stats.seconds += time.perf_counter() - t0
        self._logp_cache = None
        if P * Ts * V * 4 <= logp_budget:
            self._logp_cache = torch.cat([self._base_logp(k, k + self.kl_chunk_rows)
                                          for k in range(0, P, self.kl_chunk_rows)], 0)

    @property
    def num_layers(self) -> int:
        return self.runner.num_layers

    def _vocab(self) -> int:
        head = self.runner.loc.head
        w = getattr(head, "weight", None)
        return int(w.shape[0]) if w is not None else int(self.runner.model.config.vocab_size)

    def _scored(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.positions == "all" else h[:, -1:, :]

    @torch.inference_mode()
    def _base_logp(self, a: int, b: int) -> torch.Tensor:
        h = self._scored(self.base.states[-1][a:b])
        return torch.log_softmax(self.runner.logits(h).float(), dim=-1)

    @torch.inference_mode()
    def kl_per_prompt(self, h_last: torch.Tensor) -> torch.Tensor:
        """Per-prompt KL [P] (nats, float32, on CPU) of a variant's last-block output [P, T, D]."""
        out = []
        P = h_last.shape[0]
        for a in range(0, P, self.kl_chunk_rows):
            b = min(P, a + self.kl_chunk_rows)
            lb = self._logp_cache[a:b] if self._logp_cache is not None else self._base_logp(a, b)
            logits = self.runner.logits(self._scored(h_last[a:b]))
            out.append(kl_rows(lb.to(logits.device), logits).mean(-1).float().cpu())
        return torch.cat(out)

    @torch.inference_mode()
    def noise_floor(self, n: int = 2) -> float:
        """Mean KL (nats) between the engine's batched baseline and batch-of-one full forwards of the model
        on the first ``n`` prompts: differences below this are numerical noise, not signal."""
        vals = []
        for k in range(min(n, self.ids.shape[0])):
            out = self.runner.model(input_ids=self.ids[k:k + 1].to(self.runner.input_device()), use_cache=False)
            logits = self._scored(out.logits)
            lb = self._base_logp(k, k + 1).to(logits.device)
            vals.append(kl_rows(lb, logits).mean().item())
        return float(sum(vals) / max(1, len(vals)))

    def sweep(self, pairs: Iterable[tuple[int, int]], progress: ProgressFn | None = None,
              on_pair: PairFn | None = None, should_stop: Callable[[], bool] | None = None) -> dict:
        """Compute every pair.  Returns ``{(i, j): {"repl_ij": [P], "repl_ji": [P], "inter": [P]}}`` where
        ``repl_ij`` is KL of ``M[i<-j]`` (slot i runs block j), ``repl_ji`` of ``M[j<-i]``, ``inter`` of
        ``M[i<->j]``; float32 CPU tensors, nats.  ``on_pair(i, j, vectors)`` is called as each pair
        completes (in order of gap, adjacent first); ``should_stop()`` is polled between chunks and raises
        :class:`ComputeInterrupted` (finished pairs were already handed to ``on_pair``)."""
        pairs = list(pairs)
        L = self.num_layers
        for i, j in pairs:
            if not (0 <= i < j < L):
                raise ValueError(f"bad pair ({i}, {j}) for {L} layers")
        total = 3 * len(pairs)
        done = 0
        results: dict = {}
        chunk = max(1, self.max_live // 3)
        P = self.ids.shape[0]
        for c in range(0, len(pairs), chunk):
            if should_stop is not None and should_stop():
                raise ComputeInterrupted(f"stopped after {done // 3} of {len(pairs)} pairs")
            part = pairs[c:c + chunk]
            t0 = time.perf_counter()
            for label, vec in self._sweep_chunk(part):
                kind = label[0]
                key = (min(label[1], label[2]), max(label[1], label[2]))
                slot_name = "inter" if kind == "inter" else ("repl_ij" if label[1] < label[2] else "repl_ji")
                results.setdefault(key, {})[slot_name] = vec
                done += 1
                self.stats.variants += 1
                if progress is not None:
                    progress(done, total, f"{kind} {label[1]}{'<->' if kind == 'inter' else '<-'}{label[2]}")
                if len(results[key]) == 3 and on_pair is not None:
                    on_pair(key[0], key[1], results[key])
            self.stats.seconds += time.perf_counter() - t0
        self.stats.naive_block_calls += P * L * 3 * len(pairs)
        self.stats.oom_retries = list(self.batch.retries)
        return results

    @torch.inference_mode()
    def _sweep_chunk(self, pairs: list[tuple[int, int]]):
        """Slot-by-slot sweep over the variants of ``pairs``; yields (label, per-prompt KL) as they finish."""
        L = self.num_layers
        states = self.base.states
        live: list[_Rows] = []
        for s in range(L):
            # variants whose first modified slot is s start from the cached baseline
            for i, j in pairs:
                if i == s:
                    live.append(_Rows(states[i], i, ("shared", i, j), {i: j}, fork_at=j))
                if j == s:
                    live.append(_Rows(states[j], j, ("repl", j, i), {j: i}))
            # a shared branch reaching its fork splits into M[i<-j] and M[i<->j]
            forked = []
            for r in live:
                if r.fork_at == s:
                    _, i, j = r.label
                    forked.append(_Rows(r.h, s, ("repl", i, j)))
                    forked.append(_Rows(r.h, s, ("inter", i, j), {j: i}))
                else:
                    forked.append(r)
            live = forked
            # group by the block each row set runs at this slot; one batched call per group
            groups: dict[int, list[_Rows]] = {}
            for r in live:
                groups.setdefault(r.overrides.get(s, s), []).append(r)
            for block, rows in groups.items():
                x = rows[0].h if len(rows) == 1 else torch.cat([r.h for r in rows], 0)
                y = self.batch.run(lambda part, b=block: self.runner.run_slot(self.base, s, b, part), x)
                self.stats.block_calls += x.shape[0]
                off = 0
                for r in rows:
                    n = r.h.shape[0]
                    r.h = y[off:off + n]
                    off += n
        for r in live:
            yield r.label, self.kl_per_prompt(r.h)
