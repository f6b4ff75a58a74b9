"""A block's call and output, as a model's forward passes and returns them (no torch import: the removal methods'
module files use these and stay importable without torch).

A block is called with its hidden states (first positional or the keyword ``hidden_states``) and other arguments
(:func:`hidden_in`, :func:`call_args`); it returns its hidden states alone or a tuple led by them (:func:`hidden_of`, :func:`as_kind`).
:func:`record_calls` reads both off one forward.
"""
from __future__ import annotations


def hidden_of(out):
    """The hidden states of a block's output ``out`` (a tensor, or a tuple led by them)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def hidden_in(args: tuple, kwargs: dict):
    """The hidden states a block is called with: its first positional argument, else the keyword ``hidden_states``."""
    return args[0] if args else kwargs["hidden_states"]


def as_kind(kind: type, items) -> tuple:
    """``items`` as a tuple of type ``kind``, a block output's own type (a named tuple stays one: a forward may read
    its fields, as Reformer's does)."""
    return kind._make(items) if hasattr(kind, "_make") else kind(items)


def call_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block call's arguments without its hidden states: ``(args after them, kwargs without hidden_states)``."""
    return tuple(args[1:]), {k: v for k, v in kwargs.items() if k != "hidden_states"}


def record_calls(blocks, run) -> tuple[list, list]:
    """``(calls, outs)`` of the forward ``run()`` makes: per block of ``blocks``, ``(hidden states as keyword?, args,
    kwargs)`` of its (last) call without the hidden states (:func:`call_args`), and its output."""
    calls: list = [None] * len(blocks)
    outs: list = [None] * len(blocks)

    def pre(slot):
        def hook(mod, args, kwargs):
            calls[slot] = (not args, *call_args(args, kwargs))
        return hook

    def post(slot):
        def hook(mod, args, out):
            outs[slot] = out
        return hook

    handles = [b.register_forward_pre_hook(pre(s), with_kwargs=True) for s, b in enumerate(blocks)]
    handles += [b.register_forward_hook(post(s)) for s, b in enumerate(blocks)]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return calls, outs
