"""The bridged-span sweep: per-prompt KL(base ‖ model with blocks i..j−1 replaced by their bridge), and beside it
the same span removed without a bridge, for many spans in one pass (docs/repair.md).

It is the swap-KL engine's machinery (:mod:`swapkl.scoring.slots`, :mod:`swapkl.scoring.headkl`) with other variants:

* **prefix reuse** - a variant equals the baseline before block i, so it starts from the cached baseline stream
  mapped by its form (:func:`swapkl.repair.bridge.start_state`: residual ``h_i W``, folded ``h_i + m_{i−1} (W − I)``,
  ``m_{i−1}`` that block's MLP output on the prompts, read once with hooks on a private tree); removal without a
  bridge ``h_i``;
* **batching** - from slot j on every live variant runs its own block j in slot j (as in the pruned model, whose
  block j keeps its position-dependent behaviour), so all of them run in one call per slot;
* **head only where scored**, KL chunked over prompts, through the KL implementation of the contract.
Spans that run to the last block (``j = L``) run no block: the final norm and head read the bridged state.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from swapkl.errors import ComputeInterrupted
from swapkl.repair.bridge import Bridge, start_state
from swapkl.repair.calibration import capture_tree
from swapkl.scoring.engine import SweepStats
from swapkl.scoring.headkl import HeadKL
from swapkl.scoring.kl import KLFunction
from swapkl.model.handed import handed_form
from swapkl.scoring.slots import BatchController, BlockRunner, run_row_sets


class BridgedSweep:
    """Per-prompt KL vectors of bridged and unbridged span removals on the prompts ``ids`` [P, T].

    ``max_rows``: prompt rows per block call (halved on out-of-memory); ``max_live``: variant row sets alive at once
    (two per span: bridged and raw), which bounds memory to about ``max_live · P · T · D`` activations; ``folded``:
    the blocks whose MLP output the bridges' forms read (:func:`swapkl.repair.bridge.captured_blocks`; read once on
    the prompts)."""

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, positions: str = "all",
                 kl_dtype: torch.dtype = torch.float32, max_rows: int = 64, max_live: int = 32,
                 kl_impl: str = "auto", logp_budget: int = 512 * 2**20, folded: set[int] = frozenset()):
        self.runner = BlockRunner(model)
        self.ids = ids
        self.stats = SweepStats()
        self.batch = BatchController(max_rows, where="block", retries=self.stats.oom_retries)
        self.max_live = max(2, max_live)
        kl_batch = BatchController(1, where="kl", retries=self.stats.oom_retries)
        self.head = HeadKL(self.runner, positions, kl_dtype, KLFunction(kl_impl, self.runner.head_device()),
                           kl_batch, self.stats)
        P, T = ids.shape
        kl_batch.max_rows = self.head.default_chunk_rows(T)
        t0 = time.perf_counter()
        self.base = self.runner.baseline(ids, self.batch)
        self.head.start(self.base, P, T, logp_budget)
        self.mlp_out = self._mlp_outputs(model, folded)
        self.stats.seconds += time.perf_counter() - t0

    @torch.inference_mode()
    def _mlp_outputs(self, model, blocks: set[int]) -> dict[int, torch.Tensor]:
        """``{k: m_k [P, T, D]}``: block k's MLP output on the prompts (its output projection's output)."""
        if not blocks:
            return {}
        forward, got = capture_tree(model, set(), set(blocks))
        out: dict[int, list] = {k: [] for k in blocks}

        def run(a: int, b: int) -> None:
            forward(self.ids[a:b].to(self.runner.input_device()))
            for k in blocks:
                out[k].append(got[("m", k)])
            got.clear()

        self.batch.map(run, self.ids.shape[0], "baseline")
        return {k: torch.cat(v, 0) for k, v in out.items()}

    @property
    def num_layers(self) -> int:
        return self.runner.num_layers

    def start_state(self, br: Bridge) -> torch.Tensor:
        """The bridged stream where block ``br.end`` starts (module docstring), in the model's dtype."""
        return start_state(br, self.base.states[br.start], self.mlp_out)

    def sweep(self, bridges: list[Bridge], on_chunk: Callable[[dict], None] | None = None,
              progress: Callable[[int, int, str], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> dict:
        """``{(i, j): {"bridged": [P], "raw": [P]}}`` (float CPU tensors, nats) for every bridge's span;
        ``on_chunk(vectors)`` once per finished chunk of spans (one durable cache write), ``should_stop()`` polled
        between chunks (raises :class:`ComputeInterrupted`; finished chunks were handed on)."""
        chunk = max(1, self.max_live // 2)
        out: dict = {}
        for c in range(0, len(bridges), chunk):
            if should_stop is not None and should_stop():
                raise ComputeInterrupted(f"stopped after {c} of {len(bridges)} spans")
            t0 = time.perf_counter()
            part = bridges[c:c + chunk]
            vecs = self._chunk(part)
            out.update(vecs)
            self.stats.seconds += time.perf_counter() - t0
            self.stats.variants += 2 * len(part)
            if on_chunk is not None:
                on_chunk(vecs)
            if progress is not None:
                progress(c + len(part), len(bridges), f"span {part[-1].start}..{part[-1].end - 1}")
        return out

    @torch.inference_mode()
    def _chunk(self, part: list[Bridge]) -> dict:
        L = self.num_layers
        handed = self.base.handed or [None] * (L + 1)
        live: list[list] = []  # [(span), kind, h, handed-on states (None: the model hands none on)]
        for s in range(L + 1):
            for br in part:
                if br.end == s:  # block j receives what block i-1 handed on, as in the pruned model
                    live.append([(br.start, br.end), "bridged", self.start_state(br), handed[br.start]])
                    live.append([(br.start, br.end), "raw", self.base.states[br.start], handed[br.start]])
            if s == L or not live:
                continue
            groups: dict = {}
            for r in live:
                groups.setdefault(None if r[3] is None else handed_form(r[3]), []).append(r)
            for form, rows in groups.items():
                self._run(s, rows, form is not None)
        kls = self.head.kl_many([self.runner.final_state(r[2], r[3]) for r in live])
        out: dict = {}
        for (span, kind, _, _), v in zip(live, kls):
            out.setdefault(span, {})[kind] = v
        return out

    def _run(self, s: int, rows: list[list], handed: bool) -> None:
        """Block s in slot s on the row sets ``rows`` in one batched call (their states and, with ``handed``, what
        they were handed on, replaced in place)."""
        hs, given, n = run_row_sets(self.runner, self.batch, s, s, [r[2] for r in rows],
                                    [r[3] for r in rows] if handed else None, self.ids.shape[0])
        for k, r in enumerate(rows):
            r[2] = hs[k]
            if given is not None:
                r[3] = given[k]
        self.stats.block_calls += n
