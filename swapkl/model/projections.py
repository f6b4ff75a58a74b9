"""A projection's weight layout, recognised in one place: ``nn.Linear`` keeps its weight as [out, in], GPT-2's
``Conv1D`` (``transformers.pytorch_utils.Conv1D``, recognised by its class name so that this module needs no torch or
transformers import) as [in, out].  Discovery, sublayer skipping, the support check, a user's family description,
the bridge's fold and export and LoRA targets all ask here."""
from __future__ import annotations

CONV1D = "Conv1D"
#: the two weight layouts, as :attr:`swapkl.model.families.Family.mlp_out_layout` and the bridge's fold name them
LINEAR_LAYOUT, CONV1D_LAYOUT = "linear", "conv1d"
WEIGHT_LAYOUTS = (LINEAR_LAYOUT, CONV1D_LAYOUT)


def is_conv1d(module) -> bool:
    """Whether ``module`` is a GPT-2-style ``Conv1D`` (weight [in, out])."""
    return type(module).__name__ == CONV1D


def weight_layout(module) -> str:
    """``"conv1d"`` (weight [in, out]) or ``"linear"`` (weight [out, in])."""
    return CONV1D_LAYOUT if is_conv1d(module) else LINEAR_LAYOUT


def out_width(module) -> int:
    """The output width of a projection: ``nn.Linear.out_features``, a ``Conv1D``'s ``nf``, else the weight's
    output axis for its layout."""
    for attr in ("out_features", "nf"):
        v = getattr(module, attr, None)
        if isinstance(v, int):
            return v
    w = getattr(module, "weight", None)
    if w is not None and getattr(w, "dim", lambda: 0)() == 2:
        return int(w.shape[1] if is_conv1d(module) else w.shape[0])
    raise TypeError(f"cannot tell the output width of {type(module).__name__}")
