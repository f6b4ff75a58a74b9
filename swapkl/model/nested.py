"""Nested arguments as leaves: a block's call (tuples, lists and dicts of tensors and settings) flattened to a list
of leaves and rebuilt around new ones."""
from __future__ import annotations


def flatten(obj) -> tuple[object, list]:
    """``(spec, leaves)`` of nested tuples, lists and dicts (anything else is a leaf)."""
    leaves: list = []

    def go(o):
        if isinstance(o, tuple):
            return ("t", [go(x) for x in o])
        if isinstance(o, list):
            return ("l", [go(x) for x in o])
        if isinstance(o, dict):
            return ("d", [(k, go(v)) for k, v in o.items()])
        leaves.append(o)
        return ("*", len(leaves) - 1)

    return go(obj), leaves


def unflatten(spec, leaves: list):
    """The inverse of :func:`flatten` with new leaves."""
    kind, body = spec
    if kind == "*":
        return leaves[body]
    if kind == "t":
        return tuple(unflatten(s, leaves) for s in body)
    if kind == "l":
        return [unflatten(s, leaves) for s in body]
    return {k: unflatten(s, leaves) for k, s in body}
