"""The plain, obviously correct swap-KL implementation (the way the paper's scripts work).

Every variant is a full forward from the token ids, batch of one, on a private copy of the model.  Under the
``slot`` definition (docs/method.md §1) the moved weights are copied into the slots by ``load_state_dict`` (and
restored afterwards); a pair whose weights ``load_state_dict`` refuses (other names or shapes) is undefined.  Under
the ``block`` definition the block *modules* are moved: the copy's block list holds block j's module object in slot
i, called with what the model's forward gives block j in its own slot (its mask, rotary table, per-layer inputs,
recorded from a forward of the unmodified model on the same prompt).  For a sublayer unit (docs/method.md "Sublayer
units") slot i keeps its block and takes unit j: its weights (``slot``: :func:`~swapkl.model.units.mixed_weights`)
or its modules (``block``; the call follows the attention).  A state the blocks hand on to each other (top-k indices,
a router state) is what the block run before hands on, as the forward's own loop passes it; a variant whose forward
raises (a block that needs such a state in slot 0) is undefined.  It is slow on purpose: the engine is tested and benchmarked against it.
"""
from __future__ import annotations

import copy

import torch

from swapkl.model.architectures import locate
from swapkl.model.block_io import hidden_in, record_calls
from swapkl.model.handed import find_channels, get_arg, with_args
from swapkl.model.units import layout_for, mixed_weights, unit_keys
from swapkl.scoring.definitions import CALL_UNIT


class PlainReference:
    """A private copy of ``model`` whose slots take any weights: :meth:`kl` of a variant given as
    ``{slot: state_dict}`` against the unmodified model, per prompt, by full forwards."""

    @torch.inference_mode()
    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, positions: str = "all",
                 kl_dtype: torch.dtype = torch.float64):
        self.model, self.ids, self.positions, self.kl_dtype = model, ids, positions, kl_dtype
        self.work = copy.deepcopy(model).eval()
        self.loc = locate(self.work)
        self.blocks = self.loc.blocks
        #: each block's weights as they were (cloned: the copy's blocks are overwritten and restored)
        self.original = [{k: v.clone() for k, v in b.state_dict().items()} for b in locate(model).blocks]
        self._calls: dict[int, list] = {}
        self.channels: tuple = ()  # the states the blocks hand on (read with the first own_calls)
        self.base = [self._forward(ids[p]) for p in range(ids.shape[0])]

    def _forward(self, row: torch.Tensor) -> torch.Tensor:
        logits = self.work(input_ids=row[None], use_cache=False).logits[0].to(self.kl_dtype)
        if self.positions == "last":
            logits = logits[-1:]
        return torch.log_softmax(logits, -1)

    def _kls(self) -> torch.Tensor:
        vals = []
        for p in range(self.ids.shape[0]):
            lp = self._forward(self.ids[p])
            vals.append((self.base[p].exp() * (self.base[p] - lp)).sum(-1).mean())
        return torch.stack(vals)

    def unit_weights(self, slot: int, block: int, unit: str) -> dict:
        """What slot ``slot`` holds when it takes block ``block``'s ``unit``: block ``block``'s weights for
        ``block``, else slot ``slot``'s own with the unit's entries from block ``block``."""
        if unit == "block":
            return self.original[block]
        keys = unit_keys(self.blocks[slot], layout_for(self.model, locate(self.model)), unit)
        return mixed_weights(self.original[slot], self.original[block], keys)

    def fits(self, slot: int, weights: dict) -> bool:
        """Whether ``load_state_dict`` takes ``weights`` into slot ``slot`` (the same names and shapes)."""
        own = self.blocks[slot].state_dict()
        return own.keys() == weights.keys() and all(own[k].shape == weights[k].shape for k in own)

    @torch.inference_mode()
    def kl(self, assign: dict) -> torch.Tensor:
        """Per-prompt KL [P] (nats, ``kl_dtype``) of the model whose slots hold ``assign[slot]`` (state dicts)."""
        for slot, weights in assign.items():
            self.blocks[slot].load_state_dict(weights)
        try:
            return self._kls()
        finally:
            for slot in assign:
                self.blocks[slot].load_state_dict(self.original[slot])

    @torch.inference_mode()
    def own_calls(self, p: int) -> list[tuple[bool, tuple, dict]]:
        """What the unmodified model's forward passes each slot for prompt ``p`` besides the hidden states:
        ``(hidden states as keyword?, args, kwargs)`` per slot (batch of one).  Also reads the states the blocks
        hand on to each other (``self.channels``, :func:`~swapkl.model.handed.find_channels`)."""
        if p not in self._calls:
            got, outs = record_calls(self.blocks, lambda: self.work(input_ids=self.ids[p][None], use_cache=False))
            self.channels = find_channels([c[1:] for c in got], outs)
            self._calls[p] = got
        return self._calls[p]

    @torch.inference_mode()
    def kl_moved(self, assign: dict, unit: str = "block") -> torch.Tensor:
        """Per-prompt KL [P] of the model whose slot s runs block ``assign[s]``'s own module (``unit`` block), or
        slot s's block with block ``assign[s]``'s own unit modules; each moved module called with what the model
        gives it in its own slot (its call: masks, rotary tables, per-layer inputs; for a sublayer, the call of the
        block whose attention runs)."""
        own = [self.own_calls(p) for p in range(self.ids.shape[0])]  # recorded before any module moves
        mods = list(self.blocks)
        caller: dict[int, int] = {}  # id(module) -> the slot whose call it takes
        saved: list = []
        if unit == "block":
            for s, b in assign.items():
                self.blocks._modules[str(s)] = mods[b]
                caller[id(mods[b])] = b
        else:
            paths = layout_for(self.model, locate(self.model)).spec(unit).modules
            donors = {(s, path): mods[b].get_submodule(path) for s, b in assign.items() for path in paths}
            for (s, path), donor in donors.items():  # every donor read before any module is replaced
                parent_path, _, name = path.rpartition(".")
                parent = mods[s].get_submodule(parent_path) if parent_path else mods[s]
                saved.append((parent, name, parent._modules[name]))
                parent._modules[name] = donor
            caller = {id(mods[s]): (b if unit == CALL_UNIT else s) for s, b in assign.items()}
        vals = []
        try:
            for p in range(self.ids.shape[0]):
                calls = own[p]

                def hook(mod, args, kwargs, calls=calls):
                    h = hidden_in(args, kwargs)
                    live = (tuple(args[1:]), {n: v for n, v in kwargs.items() if n != "hidden_states"})
                    keyword, a, k = calls[caller[id(mod)]]
                    # its own call, but what the block run before it handed on (the forward's loop passes it)
                    a, k = with_args(a, k, self.channels, tuple(get_arg(*live, c.arg) for c in self.channels))
                    return (a, {**k, "hidden_states": h}) if keyword else ((h, *a), dict(k))

                handles = [m.register_forward_pre_hook(hook, with_kwargs=True)
                           for m in {id(m): m for m in self.blocks}.values() if id(m) in caller]
                try:
                    lp = self._forward(self.ids[p])
                finally:
                    for h in handles:
                        h.remove()
                vals.append((self.base[p].exp() * (self.base[p] - lp)).sum(-1).mean())
            return torch.stack(vals)
        finally:
            for s, m in enumerate(mods):
                self.blocks._modules[str(s)] = m
            for parent, name, child in reversed(saved):
                parent._modules[name] = child


@torch.inference_mode()
def reference_sweep(model: torch.nn.Module, ids: torch.Tensor, pairs, positions: str = "all",
                    kl_dtype: torch.dtype = torch.float64, unit: str = "block", per_layer: str = "slot") -> dict:
    """``{(i, j): {"repl_ij", "repl_ji", "inter"}}`` per-prompt KL vectors [P] (nats, CPU): ``repl_ij`` slot i
    takes block j's ``unit``, ``repl_ji`` slot j takes block i's, ``inter`` both at once.  Under ``slot`` a pair
    whose weights do not fit each other's slots is left out (undefined; :func:`undefined_pairs` lists them).

    ``kl_dtype``: float64 (default, for tests: the most accurate target) or float32 (as the paper's scripts,
    for benchmarks)."""
    ref = PlainReference(model, ids, positions, kl_dtype)
    skip = set(undefined_pairs(model, pairs, unit)) if per_layer == "slot" else set()
    out = {}
    for i, j in pairs:
        if (i, j) in skip:
            continue
        if per_layer == "block":
            try:
                out[(i, j)] = {"repl_ij": ref.kl_moved({i: j}, unit), "repl_ji": ref.kl_moved({j: i}, unit),
                               "inter": ref.kl_moved({i: j, j: i}, unit)}
            except Exception:  # the model's own forward refuses this order: undefined
                pass
            continue
        wij, wji = ref.unit_weights(i, j, unit), ref.unit_weights(j, i, unit)
        if not (ref.fits(i, wij) and ref.fits(j, wji)):
            continue
        try:
            out[(i, j)] = {"repl_ij": ref.kl({i: wij}), "repl_ji": ref.kl({j: wji}), "inter": ref.kl({i: wij, j: wji})}
        except Exception:  # the model's own forward refuses this order: undefined
            pass
    return out


def undefined_pairs(model: torch.nn.Module, pairs, unit: str = "block") -> list[tuple[int, int]]:
    """The pairs whose weights ``load_state_dict`` would refuse in each other's slots (the ``slot`` definition's
    undefined pairs), by comparing state-dict names and shapes."""
    blocks = locate(model).blocks
    keys = None
    if unit != "block":
        layout = layout_for(model, locate(model))
        keys = [unit_keys(b, layout, unit) for b in blocks]

    def shape(s: int) -> dict:
        sd = blocks[s].state_dict()
        return {k: tuple(v.shape) for k, v in sd.items() if keys is None or k in keys[s]}

    out = []
    for i, j in pairs:
        a, b = shape(i), shape(j)
        if a != b:
            out.append((i, j))
    return out
