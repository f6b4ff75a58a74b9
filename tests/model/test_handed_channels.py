"""find_channels (swapkl.model.handed) on recorded calls: the argument that, from block 1 on, is the very tensor the
block before returned; a state handed on by some blocks only, or through different arguments, is refused."""
from __future__ import annotations

import pytest
import torch

from swapkl.model.handed import Channel, UnsupportedHandedOn, find_channels, handed_out, join_handed, split_handed, with_args


def _chain(n: int, arg, skip: int | None = None):
    """Calls and outputs of ``n`` blocks, block k handing output 1 on to block k+1's ``arg`` (except into ``skip``)."""
    outs = [(torch.zeros(1, 3, 4), torch.full((1, 3, 2), k)) for k in range(n)]
    calls = []
    for k in range(n):
        state = None if k == 0 or k == skip else outs[k - 1][1]
        mask = torch.ones(1, 1, 3, 3)
        calls.append(((state, mask), {}) if isinstance(arg, int) else ((mask,), {arg: state}))
    return calls, outs


def test_a_keyword_and_a_positional_channel():
    assert find_channels(*_chain(4, "prev_topk_indices")) == (Channel("prev_topk_indices", 1),)
    assert find_channels(*_chain(4, 0)) == (Channel(0, 1),)


def test_no_channel_when_nothing_is_handed_on():
    calls = [((torch.ones(1, 1, 3, 3),), {}) for _ in range(3)]
    assert find_channels(calls, [torch.zeros(1, 3, 4)] * 3) == ()


def test_a_state_handed_on_by_some_blocks_only_is_refused():
    with pytest.raises(UnsupportedHandedOn, match="not one channel"):
        find_channels(*_chain(4, "prev_topk_indices", skip=2))


def test_arguments_and_outputs_are_rebuilt_around_the_state():
    ch = (Channel("prev", 1),)
    args, kwargs = with_args((1,), {"prev": None, "mask": 2}, ch, ("s",))
    assert args == (1,) and kwargs == {"prev": "s", "mask": 2}
    assert handed_out((torch.zeros(1), "t"), ch) == ("t",)
    a, b = torch.arange(2)[:, None], torch.arange(2, 5)[:, None]
    joined = join_handed([(a, None), (b, None)])
    assert torch.equal(joined[0], torch.arange(5)[:, None]) and joined[1] is None
    back = split_handed(joined, [2, 3])
    assert torch.equal(back[0][0], a) and torch.equal(back[1][0], b) and back[1][1] is None
