"""Prefix sharing for the in-memory lm-eval path (docs/tasks.md, "Prefix sharing") and for removal curves
(docs/removal.md, "Work reuse").

A model without the layers S computes exactly what the base model computes up to the hidden state that *enters* the
first removed layer f = min(S): blocks 0..f-1 are the same modules with the same slots (``layer_idx``), on the same
inputs.  lm-eval evaluates every variant of a run on the same batches (the same requests, sorted and batched the same
way, with right padding and no attention mask, so a batch is identified by its token tensor).  :class:`PrefixStore`
therefore records, while the base model is evaluated, the hidden state entering each layer some variant of the run
starts removing at, per batch (keyed by the batch's token ids); a variant's private pruned copy then has its blocks
0..f-1 replaced (on that copy only) by a function that returns the stored state for a known batch -- only blocks
after f, the final norm and the head run -- and falls back to the blocks themselves for a batch it does not know
(the plain path, bit for bit).  The stored states are bounded (``budget_bytes``); past the bound, batches are not
recorded and their variants run in full.  Equality with the plain path: ``tests/removal/test_tasks_prefix.py``.
"""
from __future__ import annotations

import hashlib
from typing import Iterable
from swapkl.model.block_io import as_kind, hidden_in, hidden_of

#: hidden states kept for one run, at most (past it, batches run in full)
STATES_BUDGET_BYTES = 2 ** 30
#: the same for a removal-curves run (swapkl.removal.curves: every block's entry state of the evaluation windows)
CURVES_STATES_BYTES = 2 ** 29


def _input_ids(args, kwargs):
    x = args[0] if args else kwargs.get("input_ids")
    return x if x is not None and hasattr(x, "shape") else None


def batch_key(ids) -> tuple:
    """A batch of token ids, identified by its shape and a hash of its values."""
    return tuple(ids.shape), hashlib.blake2b(ids.detach().cpu().numpy().tobytes(), digest_size=16).hexdigest()


def recording_every_block(model, num_layers: int, budget_bytes: int):
    """``(store, copy)``: a :class:`PrefixStore` of the state entering every block 1..num_layers-1 (a removal set is
    not known before the base runs: any block may be its first) and the private copy of ``model`` that fills it."""
    store = PrefixStore(range(1, num_layers), budget_bytes=budget_bytes)
    return store, store.recording(model)


class PrefixStore:
    """The base model's hidden states entering ``layers`` (0 excluded: nothing to share), per lm-eval batch."""

    def __init__(self, layers: Iterable[int], budget_bytes: int = STATES_BUDGET_BYTES):
        """``layers``: the first removed layer of each variant of the run."""
        self.layers = sorted({int(f) for f in layers} - {0})
        self.budget = int(budget_bytes)
        self.states: dict = {}  # batch key -> {layer: (hidden state entering it, (tuple type, output tail) of the
        #                                              block before: what it hands on, None for a tensor output)}
        self.bytes = 0
        self.stats = {"recorded_batches": 0, "unrecorded_batches": 0, "shared_batches": 0, "full_batches": 0}

    def recording(self, model):
        """A private copy of ``model`` (:func:`~swapkl.surgery.blocks.pruned_copy` with nothing removed, so the
        caller's modules get no hooks) that records the states of every batch it runs."""
        from swapkl.model import architectures as arch
        from swapkl.surgery.blocks import pruned_copy

        priv = pruned_copy(model, [])
        blocks = arch.locate(priv).blocks
        cur: dict = {}

        def top(mod, args, kwargs):
            ids = _input_ids(args, kwargs)
            cur["row"] = None
            if ids is None:
                return
            k = batch_key(ids)
            if k in self.states:
                return  # the same batch again: already recorded
            if self.bytes + self._batch_bytes(ids, priv) <= self.budget:
                cur["row"] = self.states[k] = {}
                self.stats["recorded_batches"] += 1
            else:
                self.stats["unrecorded_batches"] += 1

        def enter(f):
            def hook(mod, args, kwargs):
                if cur.get("row") is not None:
                    h = hidden_of(hidden_in(args, kwargs)).detach().clone()
                    cur["row"].setdefault(f, [None, None])[0] = h  # the block before has left already
                    self.bytes += h.numel() * h.element_size()
            return hook

        def leave(f):
            def hook(mod, args, out):
                if cur.get("row") is not None:  # before block f's entry: the entry is made here
                    tail = (type(out), tuple(out[1:])) if isinstance(out, tuple) else None
                    cur["row"].setdefault(f, [None, None])[1] = tail
            return hook

        priv.register_forward_pre_hook(top, with_kwargs=True)
        for f in self.layers:
            blocks[f].register_forward_pre_hook(enter(f), with_kwargs=True)
            blocks[f - 1].register_forward_hook(leave(f))
        return priv

    def _batch_bytes(self, ids, model) -> int:
        p = next(model.parameters())
        hidden = int(getattr(model.config, "hidden_size", 0) or getattr(model.config, "n_embd", 0) or 0)
        return int(ids.numel()) * hidden * p.element_size() * len(self.layers)

    def attach(self, pm, removed) -> bool:
        """Let ``pm`` (a private :func:`~swapkl.surgery.blocks.pruned_copy` without ``removed``) start from the stored
        state entering min(removed) on every recorded batch.  False (``pm`` untouched) when there is nothing to
        share (the first removed layer is 0 or was not recorded)."""
        from swapkl.model import architectures as arch

        f = min((int(i) for i in removed), default=0)
        if f not in self.layers:
            return False
        blocks = arch.locate(pm).blocks
        holder: dict = {}

        def top(mod, args, kwargs):
            ids = _input_ids(args, kwargs)
            holder["entry"] = self.states.get(batch_key(ids), {}).get(f) if ids is not None else None
            self.stats["shared_batches" if holder["entry"] is not None else "full_batches"] += 1

        for slot in range(f):  # the base model's blocks 0..f-1, at the same slots
            blocks[slot].forward = self._skip(blocks[slot].forward, holder, last=slot == f - 1)
        pm.register_forward_pre_hook(top, with_kwargs=True)
        return True

    @staticmethod
    def _skip(forward, holder: dict, last: bool):
        def run(*args, **kwargs):
            entry = holder.get("entry")
            if entry is None:
                return forward(*args, **kwargs)
            h, tail = entry
            out = h.clone() if last else hidden_of(hidden_in(args, kwargs))
            if tail is None:
                return out
            kind, rest = tail  # the output's own tuple type: a named tuple's fields are read (Reformer's)
            return as_kind(kind, (out, *rest))
        return run
