"""What a model's forward passes each block besides the hidden states, rebuilt for any rows of the prompts.

A slot of the sweep runs one block alone, with the arguments the model's own forward gave that block: rotary
tables, attention masks, ALiBi biases, position ids, per-layer inputs, a hybrid's original embeddings.  They are
recorded while the baseline runs (:class:`CallRecorder`) and rebuilt for each call (:class:`SlotCall`), whatever its
number of rows, because every tensor among them (a *leaf* of the call's args and kwargs) is one of:

* **shared** - the same at any batch size (a rotary table ``[1, T, d]``, a mask ``[1, 1, T, T]``): passed as it is;
* **tiled** - one block of rows per prompt, the same for every prompt (BLOOM's ALiBi ``[B·H, 1, T]``, a mask expanded
  to ``[B, 1, T, T]``): the batch-1 block repeated once per row;
* **per prompt** - one block of rows per prompt that depends on the prompt (per-layer inputs computed from the
  tokens, a hybrid's original embeddings): stored for every prompt and gathered for the rows of the call.

Which leaf is which is read off two probes, the first prompt alone and twice (``[1·k, ...]`` against ``[2·k, ...]``:
per row, multiplicity k), and the baseline's chunks tell tiled from per prompt.  Row r of a call is prompt
``rows[r]``: the sweeps concatenate row sets of all P prompts, so their rows are ``(start + r) mod P``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from swapkl.errors import SwapklError
from swapkl.model.handed import Channel, UnsupportedHandedOn, find_channels
from swapkl.model.nested import flatten, unflatten


class UnsupportedCall(SwapklError):
    """A block argument that changes with the batch size in a way that cannot be rebuilt (not along dim 0)."""


SHARED, TILED, PER_PROMPT, CONST = "shared", "tiled", "per prompt", "const"


@dataclass(frozen=True)
class StateLayout:
    """Where the batch and the tokens are in the hidden state the blocks pass on.  The sweeps keep states as rows,
    ``[batch, tokens, ...]``; a model whose state is laid out otherwise (Gemma-3n's AltUp streams ``[streams, batch,
    tokens, width]``) gets its own layout back before each block and its output function."""

    batch: int = 0
    tokens: int = 1

    @property
    def plain(self) -> bool:
        return (self.batch, self.tokens) == (0, 1)

    def rows(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.plain else h.movedim((self.batch, self.tokens), (0, 1))

    def model(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.plain else h.movedim((0, 1), (self.batch, self.tokens))


def state_layout(one: tuple, two: tuple, tokens: int) -> StateLayout:
    """The layout of a hidden state of shape ``one`` at one row and ``two`` at two rows of ``tokens`` tokens."""
    grown = [d for d, (a, b) in enumerate(zip(one, two)) if b == 2 * a]
    if len(one) != len(two) or len(grown) != 1 or len(one) < 3:
        raise UnsupportedCall(f"the hidden state the blocks pass on ({list(one)} at one row, {list(two)} at two) has "
                              "no single batch dimension")
    at = [d for d, n in enumerate(two) if n == tokens and d != grown[0]]
    if not at:
        raise UnsupportedCall(f"the hidden state the blocks pass on ({list(two)}) has no dimension of the "
                              f"{tokens} tokens")
    return StateLayout(grown[0], at[0])


@dataclass
class SlotCall:
    """The call of one slot: ``build(rows)`` gives ``(args, kwargs)`` (after the hidden states) for rows whose
    prompts are ``rows`` (a LongTensor [n])."""

    spec: object
    kinds: list[str]
    values: list  # CONST: the value; SHARED / TILED: the batch-1 tensor; PER_PROMPT: [P·k, ...] of every prompt
    mult: list[int]  # rows of a leaf per prompt row (TILED, PER_PROMPT); 0 otherwise
    keyword: bool = False  # the hidden states went in as the keyword hidden_states (else first positional)
    handed: tuple[int, ...] = ()  # the leaf of each handed-on channel's argument (swapkl.model.handed), in order
    _tiles: dict = field(default_factory=dict, repr=False)

    def arrange(self, h: torch.Tensor, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The full ``(args, kwargs)`` of a block call with hidden states ``h``, passed as the forward passed them."""
        return (args, {"hidden_states": h, **kwargs}) if self.keyword else ((h, *args), kwargs)

    @property
    def per_row(self) -> bool:
        """Whether any argument has a row per prompt row (tiled or per prompt)."""
        return any(k in (TILED, PER_PROMPT) for k in self.kinds)

    def build(self, rows: torch.Tensor, handed: tuple | None = None) -> tuple[tuple, dict]:
        """``handed``: the value of each handed-on channel for these rows (what the block run before them handed
        on), in place of the baseline's; None: the baseline's."""
        out = [self._leaf(k, rows) for k in range(len(self.kinds))]
        if handed is not None:
            for k, v in zip(self.handed, handed):
                out[k] = v
        args, kwargs = unflatten(self.spec, out)
        return args, kwargs

    def handed_values(self, rows: torch.Tensor) -> tuple:
        """The baseline's value of each handed-on channel for rows ``rows``: ``[n, ...]`` tensors (or None)."""
        return tuple(self._leaf(k, rows) for k in self.handed)

    def _leaf(self, k: int, rows: torch.Tensor):
        kind, v, m = self.kinds[k], self.values[k], self.mult[k]
        n = int(rows.shape[0])
        if kind == TILED:
            key = (k, n)
            if key not in self._tiles:
                self._tiles.clear() if len(self._tiles) > 64 else None
                self._tiles[key] = v.repeat(n, *([1] * (v.dim() - 1)))
            return self._tiles[key]
        if kind == PER_PROMPT:
            return v.view(-1, m, *v.shape[1:]).index_select(0, rows.to(v.device)).reshape(n * m, *v.shape[1:])
        return v

    def to(self, dev: torch.device) -> SlotCall:
        """The same call with its tensors on ``dev``."""
        moved = [v.to(dev) if isinstance(v, torch.Tensor) else v for v in self.values]
        return SlotCall(self.spec, self.kinds, moved, self.mult, self.keyword, self.handed)


class CallRecorder:
    """Records the call of every slot through the baseline's probes and chunks.

    ``phase(name, start)`` before each forward: ``"one"`` (the first prompt alone), ``"two"`` (it twice), then
    ``"chunk"`` with the chunk's first prompt; ``record(slot, args, kwargs)`` from each block's pre-hook (args and
    kwargs without the hidden states) and ``output(slot, out)`` from its forward hook; ``finish(P)`` -> one
    :class:`SlotCall` per slot.  The first forward also finds the handed-on channels (``channels``,
    :func:`swapkl.model.handed.find_channels`)."""

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.channels: tuple[Channel, ...] = ()
        self._raw: dict[int, tuple] = {}  # the first forward's calls and outputs, until its channels are found
        self._outs: dict[int, object] = {}
        self.one: dict[int, tuple] = {}
        self.two: dict[int, list] = {}
        self.kinds: dict[int, list] = {}
        self.chunks: dict[int, list[list]] = {s: [] for s in range(num_slots)}  # per slot: per chunk, per leaf
        self.keyword: dict[int, bool] = {}
        self._phase = "one"

    def phase(self, name: str) -> None:
        if self._phase == "one" and name != "one" and self._raw:
            self._find_channels()
        self._phase = name
        if name == "chunk" and not self.kinds:
            for s in self.one:
                self.kinds[s] = self._classify(s)

    def drop_chunk(self, recorded: dict[int, int]) -> None:
        """Forget the chunks recorded after ``recorded`` (slot -> chunks kept): a chunk that failed and is redone."""
        for s, n in recorded.items():
            del self.chunks[s][n:]

    def sizes(self) -> dict[int, int]:
        return {s: len(c) for s, c in self.chunks.items()}

    def record(self, slot: int, args: tuple, kwargs: dict, keyword: bool = False) -> None:
        """``keyword``: the hidden states were the keyword ``hidden_states`` (not in ``args``/``kwargs`` here)."""
        spec, leaves = flatten((args, kwargs))
        if self._phase == "one":
            self.one.setdefault(slot, (spec, leaves))
            self._raw.setdefault(slot, (args, kwargs))
            self.keyword.setdefault(slot, keyword)
        elif self._phase == "two":
            self.two.setdefault(slot, leaves)
        else:
            kinds = self.kinds[slot]
            self.chunks[slot].append([x if kinds[k] == PER_PROMPT else None for k, x in enumerate(leaves)])

    def output(self, slot: int, out) -> None:
        """A block's output during the first forward (its handed-on channels are read off the outputs)."""
        if self._phase == "one":
            self._outs.setdefault(slot, out)

    def _find_channels(self) -> None:
        """The channels of the first forward; every slot's call gets the leaf of each channel's argument."""
        try:
            self.channels = find_channels([self._raw[s] for s in range(self.num_slots)],
                                          [self._outs.get(s) for s in range(self.num_slots)])
        except UnsupportedHandedOn as e:
            raise UnsupportedCall(str(e)) from e
        finally:
            self._raw, self._outs = {}, {}
        for s, (spec, leaves) in self.one.items():
            for c in self.channels:
                k = _top_leaf(spec, c.arg)
                v = leaves[k] if k is not None else None
                if k is None or (v is not None and not (isinstance(v, torch.Tensor) and v.dim() >= 1
                                                        and v.shape[0] == 1)):
                    raise UnsupportedCall(f"block {s} gets the handed-on {c.describe()} as "
                                          f"{type(v).__name__}: not one value per row")

    def handed_leaves(self, slot: int) -> tuple[int, ...]:
        spec = self.one[slot][0]
        return tuple(_top_leaf(spec, c.arg) for c in self.channels)

    def _classify(self, slot: int) -> list[str]:
        spec, one = self.one[slot]
        two = self.two.get(slot)
        kinds = []
        for k, a in enumerate(one):
            b = two[k] if two is not None else a
            if not isinstance(a, torch.Tensor):
                if two is not None and not _same_value(a, b):
                    raise UnsupportedCall(f"a block argument ({type(a).__name__}) changes with the batch size")
                kinds.append(CONST)
            elif a.shape == b.shape:
                kinds.append(SHARED)
            elif a.dim() >= 1 and b.dim() == a.dim() and b.shape[0] == 2 * a.shape[0] and b.shape[1:] == a.shape[1:]:
                kinds.append(PER_PROMPT)  # until the chunks show it is the same for every prompt (tiled)
            else:
                raise UnsupportedCall(f"a block argument of shape {tuple(a.shape)} takes shape {tuple(b.shape)} at two "
                                      "rows: not a batch along its first dimension")
        return kinds

    def finish(self, num_prompts: int) -> list[SlotCall]:
        if not self.kinds:
            self.phase("chunk")
        joined: dict = {}  # the same tensors passed to several slots are joined once
        calls = []
        for s in range(self.num_slots):
            spec, one = self.one[s]
            kinds, values, mult = list(self.kinds[s]), [], []
            for k, (kind, a) in enumerate(zip(kinds, one)):
                if kind != PER_PROMPT:
                    values.append(a)
                    mult.append(0)
                    continue
                parts = [c[k] for c in self.chunks[s]]
                key = tuple(id(p) for p in parts)
                if key not in joined:
                    full = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
                    m = a.shape[0]
                    if full.shape[0] != num_prompts * m:
                        raise UnsupportedCall(f"a block argument has {full.shape[0]} rows for {num_prompts} prompts")
                    same = torch.equal(full.view(num_prompts, m, *a.shape[1:]),
                                       a.to(full.device).unsqueeze(0).expand(num_prompts, *a.shape))
                    joined[key] = (TILED, a) if same else (PER_PROMPT, full)
                kind, v = joined[key]
                kinds[k] = kind
                values.append(v)
                mult.append(a.shape[0])
            calls.append(SlotCall(spec, kinds, values, mult, self.keyword.get(s, False), self.handed_leaves(s)))
        self.chunks = {}
        return calls


def _top_leaf(spec, arg: int | str) -> int | None:
    """The leaf index of top-level argument ``arg`` (positional index after the hidden states, or keyword) in the
    spec of a call's ``(args, kwargs)``, or None when it is absent or not a single leaf."""
    (_, (args, kwargs)) = spec
    body = args[1] if isinstance(arg, int) else dict(kwargs[1])
    sub = (body[arg] if arg < len(body) else None) if isinstance(arg, int) else body.get(arg)
    return sub[1] if sub is not None and sub[0] == "*" else None


def _same_value(a, b) -> bool:
    """Whether a non-tensor argument is the same at two batch sizes.  A mapping of one type counts as the same: a
    scratch container the blocks may write into (Gemma-4's KV-sharing dict; a model whose blocks *read* another
    block's entries there is refused when it is located, swapkl.model.discovery.KV_SHARING_KEYS)."""
    from collections.abc import Mapping

    if isinstance(a, Mapping) and type(a) is type(b):
        return True
    try:
        return bool(a == b) if not isinstance(a, torch.nn.Module) else a is b
    except Exception:  # an object without a usable equality: the same object counts
        return a is b
