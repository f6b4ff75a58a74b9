"""The plain, obviously correct bridged model the repair tests compare against: a deep copy of the model with the
span's blocks deleted and the bridge inserted as a module (residual: a block-shaped module ``h ↦ h W`` in the span's
place; folded: block i−1's MLP output projection followed by ``y ↦ y W``), run batch of one, KL in float64; and the
activations a bridge is fitted on, captured by plain hooks (``plain_activations``)."""
from __future__ import annotations

import copy

import numpy as np
import torch

from swapkl.model import architectures as arch


class MapBlock(torch.nn.Module):
    """Stands where the removed blocks stood: ``hidden_states ↦ hidden_states W`` (any other argument ignored)."""

    def __init__(self, W):
        super().__init__()
        self.W = torch.nn.Parameter(torch.as_tensor(np.asarray(W), dtype=torch.float32), requires_grad=False)

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states @ self.W


class ThenMap(torch.nn.Module):
    """``proj`` followed by ``y ↦ y W``."""

    def __init__(self, proj, W):
        super().__init__()
        self.proj = proj
        self.W = torch.nn.Parameter(torch.as_tensor(np.asarray(W), dtype=torch.float32), requires_grad=False)

    def forward(self, x):
        return self.proj(x) @ self.W


def plain_bridged(model, spans_ws: dict, form: str):
    """A deep copy of ``model`` with each span ``[i, j)`` of ``spans_ws`` (``{(i, j): W}``) replaced by its bridge."""
    m = copy.deepcopy(model).eval()
    loc = arch.locate(m)
    fam = loc.family
    old = list(loc.blocks)
    types = getattr(m.config, "layer_types", None)
    new, new_types = [], []
    starts = {i: (j, W) for (i, j), W in spans_ws.items()}
    k = 0
    while k < len(old):
        if k in starts:
            j, W = starts[k]
            if form == "residual":
                new.append(MapBlock(W))
                new_types.append(types[min(j, len(old) - 1)] if types else None)
            else:
                parent_path, _, name = fam.mlp_out.rpartition(".")
                parent = arch.get_path(old[k - 1], parent_path)
                setattr(parent, name, ThenMap(getattr(parent, name), W))
            k = j
            continue
        new.append(old[k])
        new_types.append(types[k] if types else None)
        k += 1
    loc.blocks._modules.clear()
    for n, b in enumerate(new):
        loc.blocks._modules[str(n)] = b
    for key in fam.num_layers_keys:
        if isinstance(getattr(m.config, key, None), int):
            setattr(m.config, key, len(new))
    if types:
        m.config.layer_types = new_types
    return m


def plain_activations(model, ids, slots, proj=None) -> dict:
    """What a plain least-squares fit of a bridge reads, by forward hooks on a deep copy of ``model`` run on the
    rows of ``ids`` [N, T] one at a time: ``{s: block s's input}`` for each slot in ``slots`` (slot L, the number of
    blocks: the last block's output) and, when ``proj`` is given, ``{"m": block proj's MLP output projection's
    output}``; each an array (N·T, d) float64, rows in token order."""
    m = copy.deepcopy(model)
    loc = arch.locate(m)
    got = {}
    for s in slots:
        if s < loc.num_layers:
            loc.blocks[s].register_forward_pre_hook(
                lambda mod, a, k, s=s: got.setdefault(s, []).append(a[0] if a else k["hidden_states"]),
                with_kwargs=True)
        else:  # slot L: the last block's output
            loc.blocks[-1].register_forward_hook(
                lambda mod, a, o, s=s: got.setdefault(s, []).append(o[0] if isinstance(o, tuple) else o))
    if proj is not None:
        arch.get_path(loc.blocks[proj], loc.family.mlp_out).register_forward_hook(
            lambda mod, a, o: got.setdefault("m", []).append(o))
    with torch.inference_mode():
        for row in ids:
            m(input_ids=row[None], use_cache=False)
    return {k: torch.cat(v, 0).reshape(-1, v[0].shape[-1]).double().numpy() for k, v in got.items()}


@torch.inference_mode()
def plain_kl(base, variant, ids) -> torch.Tensor:
    """Per-prompt KL(base ‖ variant) [P] in float64 nats, mean over every position, batch of one."""
    out = []
    for row in ids:
        lb = torch.log_softmax(base(input_ids=row[None], use_cache=False).logits[0].double(), -1)
        lv = torch.log_softmax(variant(input_ids=row[None], use_cache=False).logits[0].double(), -1)
        out.append((lb.exp() * (lb - lv)).sum(-1).mean())
    return torch.stack(out)


def near_identity(d: int, seed: int) -> np.ndarray:
    """A d×d bridge map near the identity, ``I + 0.2·N(0, 1)/√d`` (seeded): the tests' stand-in for a fitted bridge."""
    rng = np.random.default_rng(seed)
    return np.eye(d) + 0.2 * rng.normal(size=(d, d)) / np.sqrt(d)
