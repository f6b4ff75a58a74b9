"""The folded form (ReplaceMe, least squares): the output ``m`` of block i−1's MLP (its output projection, before
the residual add) is mapped, ``h_{i−1} + m W ≈ h_j`` where ``h_{i−1} = h_i − m`` is the stream before that add; so
``W`` folds into the projection (:func:`folded_weights`) and the bridged model is an ordinary checkpoint of the same
family with fewer blocks.  A span that starts at block 0, a family without a known MLP output projection, or one
with a norm after it (Gemma's sandwich norms) has no exact fold: :func:`fold_target` says so in one line and the
span uses the residual form."""
from __future__ import annotations

from swapkl.model.projections import LINEAR_LAYOUT
from swapkl.repair.forms.base import BridgeForm, NoExactFold


def fold_target(model, start: int):
    """The module the folded form of a span starting at block ``start`` maps: block ``start − 1``'s MLP output
    projection.  Raises :class:`NoExactFold` (one line) where no exact fold exists."""
    import torch

    from swapkl.model import architectures as arch

    FORM.check_start(start)
    loc = arch.locate(model)
    fam = loc.family
    if fam.post_mlp_norm:
        raise NoExactFold(f"the {fam.name} family applies a norm ({fam.post_mlp_norm}) after the MLP output "
                          "projection: a linear map cannot be folded into it exactly; use --form residual")
    proj = arch.get_path(loc.blocks[start - 1], fam.mlp_out) if fam.mlp_out else None
    if not isinstance(proj, torch.nn.Module) or getattr(proj, "weight", None) is None:
        what = (f"block {start - 1} of the {fam.name} family has no MLP output projection" if fam.mlp_out else
                f"the {fam.name} family has no MLP output projection whose output is added to the residual stream as "
                "it is (a norm after it, or none under the usual names)")
        raise NoExactFold(f"{what} to fold the bridge into; use --form residual")
    return proj


def folded_weights(proj, layout: str, W) -> dict:
    """The projection's ``weight`` (and ``bias``) with ``W`` [D, D] folded in, so that ``proj'(x) = proj(x) W``:
    ``linear`` (``y = x Aᵀ + b``): ``A' = Wᵀ A``; ``conv1d`` (``y = x A + b``): ``A' = A W``; ``b' = b W``.  Computed in
    float64, returned in the projection's dtype and device."""
    import torch

    w = proj.weight.detach()
    T = torch.as_tensor(W, dtype=torch.float64, device=w.device)
    A = w.double()
    out = {"weight": (T.T @ A if layout == LINEAR_LAYOUT else A @ T).to(w.dtype)}
    b = getattr(proj, "bias", None)
    if b is not None:
        out["bias"] = (b.detach().double() @ T).to(b.dtype)
    return out


def fold_into(proj, layout: str, W) -> None:
    """Replace ``proj``'s weights by :func:`folded_weights` (frozen parameters; the module object is kept)."""
    import torch

    for name, t in folded_weights(proj, layout, W).items():
        proj._parameters[name] = torch.nn.Parameter(t, requires_grad=False)


class Folded(BridgeForm):
    name = "folded"
    order = 0
    description = ("W folded into block i−1's MLP output projection: an ordinary checkpoint of the same family "
                   "(residual where no exact fold exists)")
    exports = True
    fallback = "residual"
    toward = "zero"

    def check_start(self, start: int) -> None:
        if start == 0:
            raise NoExactFold("the span starts at block 0: there is no MLP before it to fold the bridge into; "
                              "use --form residual")

    def check(self, model, start: int) -> None:
        fold_target(model, start)

    def captures(self, start: int) -> set[int]:
        return {start - 1}

    def fit_rows(self, got: dict, i: int, ends) -> tuple:
        hi = got[("h", i)].double()
        m = got[("m", i - 1)].double()
        return m, [got[("h", j)].double() - hi + m for j in ends]

    def start_state(self, h, W, m=None):
        import torch

        m = m.to(h.device).float()
        return (h.float() + m @ (W - torch.eye(W.shape[0], device=h.device))).to(h.dtype)

    def site(self, loc, bridge, new_index, num_layers: int):
        from swapkl.model import architectures as arch

        return arch.get_path(loc.blocks[new_index(bridge.start - 1)], loc.family.mlp_out)

    def attach(self, site, bridge, loc) -> None:
        fold_into(site, loc.family.mlp_out_layout, bridge.W)

    def attach_map(self, site, bridge_map) -> None:
        site.register_forward_hook(bridge_map.post_hook)

    def merge(self, site, bridge, loc) -> None:
        fold_into(site, loc.family.mlp_out_layout, bridge.W)

    def params_added(self, dim: int) -> int:
        return 0


FORM = Folded()
