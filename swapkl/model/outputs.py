"""A model's output function: from the last block's output [..., T, D] to its logits [..., T, V], as the model computes
them.  One class per way, found by name in :data:`OUTPUTS` (a family names one in ``Family.output``; the generic
fallback keeps the first that reproduces the model's logits):

* :class:`HeadOutput` (``head``): the final norm, then the output head.  Most decoder-only LMs; the fast path.
* :class:`TailOutput` (``tail``): the model's *own* forward after its last block, whatever it is - logit soft-capping
  (Gemma-2, Gemma-3n, RecurrentGemma, VaultGemma), logit scaling (Cohere, Granite, MiniCPM), hyper-connection heads
  (DeepSeek-V4), a prediction head (ModernBERT-decoder), no final norm at all (OpenAI-GPT).  It runs the model's forward
  on a private copy of the module path down to the block list whose blocks are stand-ins: every block passes its input
  on, the last returns the given state, so only the embeddings (on zeros) and the model's code after the last block
  compute anything.  Shared models are never changed; concurrent calls each build their own stand-ins.
"""
from __future__ import annotations

import copy
from collections import OrderedDict

import torch

from swapkl.model.block_io import hidden_in


class OutputFunction:
    """``logits(model, loc, h_last)``: logits [n, T, V] of last-block outputs ``h_last`` [n, T, D]."""

    name: str = ""
    summary: str = ""

    def logits(self, model: torch.nn.Module, loc, h_last: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class HeadOutput(OutputFunction):
    name = "head"
    summary = "final norm, then the output head"

    def logits(self, model, loc, h_last):
        norm_dev = next(loc.final_norm.parameters(), torch.empty(0, device=h_last.device)).device
        x = loc.final_norm(h_last.to(norm_dev))
        head_dev = next(loc.head.parameters()).device
        return loc.head(x.to(head_dev))


class TailOutput(OutputFunction):
    name = "tail"
    summary = "the model's own forward after its last block (soft-capping, scaling, extra heads included)"

    def logits(self, model, loc, h_last):
        top, blocks = _private_path(model, loc.family.blocks)
        shape = getattr(loc, "block_output", None) or 0
        last = len(blocks) - 1
        for k in range(len(blocks)):
            blocks._modules[str(k)] = _stand_in(blocks._modules[str(k)], h_last if k == last else None, shape)
        emb = model.get_input_embeddings()
        dev = next(emb.parameters()).device if emb is not None else h_last.device
        ids = torch.zeros(h_last.shape[:2], dtype=torch.long, device=dev)
        return top(input_ids=ids, use_cache=False).logits


#: the output functions by name
OUTPUTS: dict[str, OutputFunction] = {f.name: f for f in (HeadOutput(), TailOutput())}


def _private_path(model: torch.nn.Module, blocks_path: str) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
    """Copies of ``model`` and of every module on ``blocks_path`` down to the block list (each with its own module
    dict, no hooks), the copies linked to each other; every other module and every tensor stays shared."""
    top = _own_copy(model)
    parent = top
    for part in blocks_path.split("."):
        child = _own_copy(parent._modules[part])
        parent._modules[part] = child
        parent = child
    return top, parent


def _own_copy(mod: torch.nn.Module) -> torch.nn.Module:
    new = copy.copy(mod)
    new._modules = OrderedDict(mod._modules)
    for hooks in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                  "_forward_hooks_always_called"):
        if hasattr(mod, hooks):
            setattr(new, hooks, OrderedDict())
    return new


def _stand_in(block: torch.nn.Module, give: torch.Tensor | None, tuple_len: int) -> torch.nn.Module:
    """A copy of ``block`` (its attributes kept: a backbone may read them) whose forward returns its input hidden
    states, or ``give`` when given, as a tensor or (``tuple_len`` > 0) a tuple of that length."""
    new = _own_copy(block)

    def forward(*args, **kwargs):
        h = give if give is not None else hidden_in(args, kwargs)
        return (h,) + (None,) * (tuple_len - 1) if tuple_len else h

    new.forward = forward
    return new
