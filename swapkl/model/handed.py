"""A state a block hands on to the next block besides the hidden states (a *channel*).

Some stacks thread a second value through their blocks: DeepSeek-sparse-attention models (GLM-MoE-DSA, HY-V4) hand
each block the top-k token indices the block before selected (``prev_topk_indices``: a "shared" layer reuses them),
ZAYA hands on its router's hidden states (positional argument 1).  The model's forward loop does it::

    h, state = block(h, state, ...)      # block k receives what block k-1 returned

A channel is found on one recorded forward: an argument of every block (a top-level positional argument after the
hidden states, or a keyword) that, from block 1 on, *is* the tensor the block before returned at one place of its
output tuple.  Its value at block 0 is what the forward gives the first block (None for these models).

When blocks are moved, the state flows in the new execution order, as it does when modules are moved in the model's
own block list: the block run at position k receives what the block run at position k-1 handed on.  The engine carries
each channel beside the hidden states (:mod:`swapkl.scoring.slots`); the plain implementations read the channels off
their own forwards with :func:`find_channels`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from swapkl.errors import SwapklError


class UnsupportedHandedOn(SwapklError):
    """A state between blocks that is not one clean channel (handed on by some blocks only, or to another argument)."""


@dataclass(frozen=True)
class Channel:
    """One handed-on state: the block argument that receives it (``arg``: the positional index after the hidden
    states, 0 for the first, or the keyword) and the place in the block's output tuple it comes from (``out`` >= 1)."""

    arg: int | str
    out: int

    def describe(self) -> str:
        where = f"positional argument {self.arg + 1}" if isinstance(self.arg, int) else f"argument {self.arg}"
        return f"{where} <- output {self.out} of the block before"


def get_arg(args: tuple, kwargs: dict, arg: int | str):
    """The value of argument ``arg`` in a call's ``args`` (after the hidden states) and ``kwargs``; None if absent."""
    if isinstance(arg, int):
        return args[arg] if arg < len(args) else None
    return kwargs.get(arg)


def with_args(args: tuple, kwargs: dict, channels: tuple[Channel, ...], values: tuple) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with each channel's argument set to its value in ``values`` (new containers)."""
    args, kwargs = list(args), dict(kwargs)
    for c, v in zip(channels, values):
        if isinstance(c.arg, int):
            args[c.arg] = v
        else:
            kwargs[c.arg] = v
    return tuple(args), kwargs


def handed_out(out, channels: tuple[Channel, ...]) -> tuple:
    """What a block's output ``out`` (a tuple led by the hidden states) hands on: one value per channel."""
    return tuple(out[c.out] for c in channels)


def find_channels(calls: list[tuple[tuple, dict]], outs: list) -> tuple[Channel, ...]:
    """The channels of one forward: ``calls[k]`` is block k's ``(args, kwargs)`` without the hidden states, ``outs[k]``
    its output.  Raises :class:`UnsupportedHandedOn` when some blocks receive an earlier output and others do not, or
    receive it through another argument."""
    found: list[set] = []
    for k in range(1, len(calls)):
        prev = outs[k - 1]
        extras = {id(t): m for m, t in enumerate(prev[1:], 1)
                  if isinstance(t, torch.Tensor)} if isinstance(prev, (tuple, list)) else {}
        args, kwargs = calls[k]
        here = {Channel(a, extras[id(v)]) for a, v in [*enumerate(args), *kwargs.items()]
                if isinstance(v, torch.Tensor) and id(v) in extras}
        found.append(here)
    if not found or not found[0]:
        if any(found):
            raise UnsupportedHandedOn("only some blocks receive a state the block before returned: not one channel")
        return ()
    if any(f != found[0] for f in found):
        raise UnsupportedHandedOn("the blocks receive the states the block before returned through different "
                                  "arguments: not one channel")
    channels = tuple(sorted(found[0], key=lambda c: (c.out, str(c.arg))))
    args0, kwargs0 = calls[0]
    for c in channels:
        present = c.arg < len(args0) if isinstance(c.arg, int) else c.arg in kwargs0
        if not present:
            raise UnsupportedHandedOn(f"block 0 is not given the handed-on {c.describe()}")
    return channels


def handed_form(handed: tuple) -> tuple:
    """What must agree for the handed-on states of several row sets to join into one call: per channel None, or the
    shape after the rows, dtype and device."""
    return tuple(None if v is None else (tuple(v.shape[1:]), v.dtype, v.device) for v in handed)


def join_handed(parts: list[tuple]) -> tuple:
    """The handed-on states of several row sets (of one :func:`handed_form`) as one: per channel, the [n_k, ...]
    tensors concatenated along the rows."""
    if len(parts) == 1:
        return parts[0]
    return tuple(None if vs[0] is None else torch.cat(vs, 0) for vs in zip(*parts))


def split_handed(handed: tuple, sizes: list[int]) -> list[tuple]:
    """The inverse of :func:`join_handed`: the handed-on states of each row set of ``sizes`` rows (views)."""
    out, off = [], 0
    for n in sizes:
        out.append(tuple(None if v is None else v[off:off + n] for v in handed))
        off += n
    return out


#: how the output function may read the last block's states: its hidden states alone, or joined with what it hands on
#: along the last dimension, the handed-on states first or after (Reformer's ``cat([attn_output, hidden_states])``)
JOINS = ("", "handed-first", "hidden-first")


def joined_state(h: torch.Tensor, handed: tuple | None, join: str) -> torch.Tensor:
    """What the output function reads of a last block's hidden states ``h`` [..., T, D] and handed-on states
    ``handed`` (each [..., T, D_k]): ``h`` for join "", else all of them concatenated along the width [..., T, D + ΣD_k]
    in the order ``join`` names (:data:`JOINS`)."""
    if not join:
        return h
    parts = [*handed, h] if join == "handed-first" else [h, *handed]
    return torch.cat(parts, -1)
