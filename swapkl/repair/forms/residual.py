"""The residual form (LinearPatch, Ghosted layers): the residual stream where block i used to start is mapped,
``h_j ≈ h_i W``, applied in front of block j (of the final norm when the span runs to the last block).  It applies
to every span of every family; the map is a hook on the stream between blocks, no module of a stock checkpoint, so a
model bridged this way does not export."""
from __future__ import annotations

from swapkl.repair.forms.base import BridgeForm


def map_hook(W):
    """A forward pre-hook that multiplies the module's hidden-states input by ``W`` (float32; positional or
    keyword)."""
    def hook(mod, args, kwargs):
        if args:
            return ((args[0].float() @ W).to(args[0].dtype),) + tuple(args[1:]), kwargs
        h = kwargs["hidden_states"]
        return args, {**kwargs, "hidden_states": (h.float() @ W).to(h.dtype)}
    return hook


class Residual(BridgeForm):
    name = "residual"
    order = 1
    description = "W on the residual stream in front of block j (every span, every family; no export)"
    exports = False
    fallback = None
    toward = "identity"

    def fit_rows(self, got: dict, i: int, ends) -> tuple:
        return got[("h", i)].double(), [got[("h", j)] for j in ends]

    def start_state(self, h, W, m=None):
        return (h.float() @ W).to(h.dtype)

    def site(self, loc, bridge, new_index, num_layers: int):
        return loc.final_norm if bridge.end == num_layers else loc.blocks[new_index(bridge.end)]

    def attach(self, site, bridge, loc) -> None:
        import torch

        dev = next(site.parameters(), next(loc.blocks[0].parameters())).device
        site.register_forward_pre_hook(map_hook(torch.as_tensor(bridge.W, dtype=torch.float32, device=dev)),
                                       with_kwargs=True)

    def attach_map(self, site, bridge_map) -> None:
        site.register_forward_pre_hook(bridge_map.pre_hook, with_kwargs=True)

    def export_refusal(self, bridge) -> str | None:
        return (f"the bridge over layers {bridge.start}..{bridge.end - 1} is in the residual form, which is no "
                "ordinary checkpoint: export the folded form (--form folded)")


FORM = Residual()
