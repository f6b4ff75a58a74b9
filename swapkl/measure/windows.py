"""The sliding windows of a perplexity evaluation (docs/method.md §3): ``window`` tokens, step ``stride``; every token
after the first is scored once, with as much left context as its window allows (see :mod:`swapkl.measure.evaluate`)."""
from __future__ import annotations

from dataclasses import dataclass

from swapkl.errors import SwapklError


class EvalTextError(SwapklError):
    """An evaluation text that is empty or too short for the evaluator."""


@dataclass(frozen=True)
class Window:
    """Tokens ``[begin, end)`` are fed; targets at positions ``first_target..end-1`` are scored."""

    begin: int
    end: int
    first_target: int

    @property
    def n_scored(self) -> int:
        return self.end - self.first_target

    @property
    def keep(self) -> int:
        """Number of trailing logits needed (the scored ones plus the unused last position)."""
        return self.end - self.first_target + 1


def make_windows(n_tokens: int, window: int, stride: int, drop_first_target: bool = False) -> list[Window]:
    """The sliding windows over ``n_tokens`` tokens (docs/method.md §3).  Raises :class:`EvalTextError` below 2 tokens."""
    if window < 2 or stride < 1 or stride > window:
        raise SwapklError(f"need window >= 2 and 1 <= stride <= window (got window {window}, stride {stride})")
    if n_tokens < 2:
        raise EvalTextError(f"evaluation text has {n_tokens} token(s); at least 2 are needed to score anything")
    out: list[Window] = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + window, n_tokens)
        first = max(prev_end, begin + 1)  # a window's first token has no context inside it
        if drop_first_target and out:
            first += 1
        if end > first:
            out.append(Window(begin, end, first))
        prev_end = end
        if end == n_tokens:
            break
    return out
