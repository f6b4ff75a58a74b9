"""Healing after a linear bridge (``heal --repair bridge``, docs/healing.md "Healing after a bridge").

The heal starts from the *bridged* model (:func:`swapkl.repair.bridge.bridged_model`): every maximal span of the
removed set is replaced by a d×d map ``W`` fitted by least squares on calibration text (:mod:`swapkl.repair`).  The
calibration windows are drawn from the evaluation corpus's prompt region, outside the scoring prompts (checked by
:func:`swapkl.repair.calibration.calibration_text`), and the heal's training chunks are cut around them
(:func:`swapkl.healing.text.corpus_train_text`'s ``avoid``; :func:`swapkl.healing.text.check_disjoint` asserts it);
the evaluation region and a held-out text are disjoint from the prompt region by construction / by the shingle check.

``--train bridge`` trains the matrices too, with LoRA: each ``W`` is a trainable float32 parameter of a
:class:`BridgeMap` initialised at its least-squares fit, hooked where its form acts:

* ``residual``: in front of block j (the final norm when the span runs to the last block), ``h ↦ h W``;
* ``folded``: on the output of block i−1's MLP output projection (LoRA included), ``m ↦ m W``; merged, the trained
  ``W`` folds into that projection exactly as the least-squares one does (:func:`merge_with_maps`), so a folded
  bridge-trained heal exports as an ordinary checkpoint.  A residual bridge is no ordinary checkpoint: its export is
  refused (:func:`check_exportable`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from swapkl.contract import stable_hash
from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.repair.bridge import Bridge, folded_weights, spans_of

#: the attribute name a :class:`BridgeMap` is registered under on the module it hooks
MAP_NAME = "swapkl_bridge"


@dataclass(frozen=True)
class HealBridge:
    """The bridges one heal starts from: ``bridges`` (one :class:`~swapkl.repair.bridge.Bridge` per span of the
    removed set, in span order), ``settings`` (:class:`~swapkl.repair.bridged_kl.BridgeSettings` as a dict),
    ``calibration`` (the calibration text's description, without its window list) and ``forms`` (``{"i-j": why the
    span uses the residual form}`` where ``folded`` was asked and no exact fold exists)."""

    bridges: tuple
    settings: dict
    calibration: dict
    forms: dict

    def key(self) -> str:
        """Names the bridged start point (with the model fingerprint kept elsewhere): settings, spans and forms."""
        return stable_hash({"settings": self.settings, "spans": [[b.start, b.end, b.form] for b in self.bridges],
                            "calibration": self.calibration})[:16]

    def to_dict(self) -> dict:
        """The contract's record: ``{"kind": "bridge", "settings", "calibration", "fits": {"i-j": fit summary},
        "forms"}``."""
        return {"kind": "bridge", "settings": dict(self.settings), "calibration": dict(self.calibration),
                "fits": {f"{b.start}-{b.end}": b.summary() for b in self.bridges}, "forms": dict(self.forms)}


class BridgedState(dict):
    """A heal's trained state ``{name: tensor}`` (LoRA, or LoRA and bridge matrices) with the ``bridges`` the heal
    started from (what :func:`swapkl.healing.heal.export_healed` needs to rebuild the healed model)."""

    def __init__(self, state: dict, bridges):
        super().__init__(state)
        self.bridges = tuple(bridges)


def settings_of(bridge: dict | None):
    """:class:`~swapkl.repair.bridged_kl.BridgeSettings` from a dict of its fields ({} or None: the defaults)."""
    from swapkl.repair.bridged_kl import BridgeSettings

    names = BridgeSettings.__dataclass_fields__
    unknown = sorted(set(bridge or {}) - set(names))
    if unknown:
        raise SwapklError(f"unknown bridge setting(s) {', '.join(unknown)}; known: {', '.join(names)}")
    return BridgeSettings(**(bridge or {}))


def calibration(tokenizer, corpus, bridge: dict | None, prompts: int, tokens: int, prompt_seed: int):
    """The calibration text of ``bridge``'s settings on ``corpus``, outside the scoring prompts (``prompts`` ×
    ``tokens`` from ``prompt_seed``, the ones the training text avoids too)."""
    from swapkl.repair.calibration import calibration_text
    from swapkl.scoring.prompts import make_prompts

    s = settings_of(bridge)
    desc = make_prompts(tokenizer, corpus, prompts, tokens, prompt_seed).description
    return calibration_text(tokenizer, corpus, desc, tokens, s.calib_tokens, s.calib_window, s.calib_seed)


def avoid_windows(calib) -> list[tuple[int, int]]:
    """The calibration windows as ``(begin, length)`` in the prompt region's token coordinates (for the training
    text's cut)."""
    return [(int(b), int(e) - int(b)) for b, e in calib.spans]


def fit(model, calib, removed, bridge: dict | None) -> HealBridge:
    """Fit one bridge per span of ``removed`` on ``calib`` (``folded`` spans without an exact fold use the residual
    form, recorded in ``forms``)."""
    from swapkl.repair.bridged_kl import span_forms
    from swapkl.repair.calibration import fit_bridges

    s = settings_of(bridge)
    spans = spans_of(removed)
    forms = span_forms(model, spans, s.form)
    out = {}
    for form in ("folded", "residual"):
        mine = [sp for sp in spans if forms[sp][0] == form]
        if mine:
            out.update(fit_bridges(model, calib, mine, form, s.ridge))
    d = {k: v for k, v in calib.description.items() if k != "window_starts"}
    return HealBridge(tuple(out[sp] for sp in spans), s.to_dict(), d,
                      {f"{i}-{j}": why for (i, j), (_, why) in forms.items() if why})


def check_exportable(bridges) -> None:
    """Refuse (one line) an export of a model with a residual bridge: a map on the residual stream between blocks is
    no module of a stock checkpoint (the folded form is)."""
    res = [f"{b.start}..{b.end - 1}" for b in bridges or () if b.form == "residual"]
    if res:
        raise SwapklError(f"the bridge over layers {', '.join(res)} is in the residual form, which is no ordinary "
                          "checkpoint: --out needs --form folded (or heal without --out)")


class BridgeMap(torch.nn.Module):
    """``h ↦ h W`` with ``W`` [D, D] a trainable float32 parameter, initialised at a least-squares fit; computed in
    float32, returned in the input's dtype."""

    def __init__(self, W, device):
        super().__init__()
        self.W = torch.nn.Parameter(torch.as_tensor(W, dtype=torch.float32, device=device).clone())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h.float() @ self.W).to(h.dtype)

    def pre_hook(self, mod, args, kwargs):
        """Residual form: the hidden states entering block j (or the final norm), positional or keyword."""
        if args:
            return (self(args[0]),) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self(kwargs["hidden_states"])}

    def post_hook(self, mod, args, out):
        """Folded form: the output of block i−1's MLP output projection."""
        return self(out)


def _new_index(removed: set, old: int) -> int:
    return old - sum(1 for k in removed if k < old)


def _target(loc, b: Bridge, gone: set, num_layers: int) -> torch.nn.Module:
    """The module a bridge's map hooks: block i−1's MLP output projection (folded), else block j or the final norm."""
    if b.form == "folded":
        return arch.get_path(loc.blocks[_new_index(gone, b.start - 1)], loc.family.mlp_out)
    return loc.final_norm if b.end == num_layers else loc.blocks[_new_index(gone, b.end)]


def attach_maps(model: torch.nn.Module, bridges, num_layers: int) -> list[BridgeMap]:
    """Hook one :class:`BridgeMap` per bridge onto ``model`` (the pruned model, changed in place; under peft its
    base model, after LoRA is applied, so a folded map acts on the LoRA-adapted projection's output); returns the
    maps in bridge order.  ``num_layers``: the source model's block count."""
    loc = arch.locate(model)
    gone = {k for b in bridges for k in range(b.start, b.end)}
    dev = next(model.parameters()).device
    maps = []
    for b in bridges:
        m = BridgeMap(b.W, dev)
        target = _target(loc, b, gone, num_layers)
        if b.form == "folded":
            target.register_forward_hook(m.post_hook)
        else:
            target.register_forward_pre_hook(m.pre_hook, with_kwargs=True)
        target.add_module(MAP_NAME, m)
        maps.append(m)
    return maps


def trained_bridges(model: torch.nn.Module, bridges, num_layers: int) -> list[Bridge]:
    """The bridges with the ``W`` (float64 numpy) of the :class:`BridgeMap` modules :func:`attach_maps` hooked onto
    ``model`` (under peft: its base model)."""
    loc = arch.locate(model)
    gone = {k for b in bridges for k in range(b.start, b.end)}
    out = []
    for b in bridges:
        m = getattr(_target(loc, b, gone, num_layers), MAP_NAME, None)
        if not isinstance(m, BridgeMap):
            raise SwapklError(f"internal: no bridge map on the model for the span [{b.start}, {b.end})")
        out.append(Bridge(b.start, b.end, b.form, m.W.detach().double().cpu().numpy(), dict(b.fit, trained=True)))
    return out


def merge_with_maps(pm, bridges, num_layers: int) -> torch.nn.Module:
    """The LoRA merged (``merge_and_unload``) and every folded map folded into its projection
    (:func:`~swapkl.repair.bridge.folded_weights`: exact, since the map acts on that projection's whole output);
    a residual map stays hooked on its block (the block object survives the merge)."""
    trained = trained_bridges(pm.get_base_model(), bridges, num_layers)
    merged = pm.merge_and_unload()
    loc = arch.locate(merged)
    gone = {k for b in bridges for k in range(b.start, b.end)}
    for b in trained:
        if b.form == "folded":
            proj = arch.get_path(loc.blocks[_new_index(gone, b.start - 1)], loc.family.mlp_out)
            for name, t in folded_weights(proj, loc.family.mlp_out_layout, b.W).items():
                proj._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
    return merged.eval()


def trainable_count(bridges) -> int:
    """Σ d² over the bridges: the parameters ``--train bridge`` adds to LoRA's."""
    return sum(int(b.W.shape[0]) * int(b.W.shape[1]) for b in bridges or ())


def prepare(shared: dict, model, tokenizer, corpus, removed, recipe, setup) -> HealBridge | None:
    """The bridges of ``removed`` a heal with ``setup.repair == "bridge"`` starts from (None without the repair),
    fitted once per session ``shared`` (the calibration text under ``shared["calib"]``, the fits per removed set
    under ``shared["bridges"]``).  Refuses (one line) ``--train bridge`` without the repair and QLoRA with it."""
    if setup.repair not in ("none", "bridge"):
        raise SwapklError(f"--repair must be none or bridge (got {setup.repair})")
    if setup.repair == "none":
        if recipe.part == "bridge":
            raise SwapklError("--train bridge trains the bridge matrices: it needs --repair bridge")
        return None
    if recipe.qlora:
        raise SwapklError("--qlora does not combine with --repair bridge")
    if "calib" not in shared:
        shared["calib"] = calibration(tokenizer, corpus, setup.bridge, setup.prompts, setup.tokens, setup.prompt_seed)
    fits = shared.setdefault("bridges", {})
    key = tuple(sorted(int(i) for i in removed))
    if key not in fits:
        fits[key] = fit(model, shared["calib"], key, setup.bridge)
    return fits[key]


def record(result, hb: HealBridge, res: dict):
    """``result`` (a :class:`~swapkl.healing.result.HealResult`) with the repair recorded: the contract's
    ``repair`` (:meth:`HealBridge.to_dict`) and ``result.repair`` = that record plus, per text (``eval``, and
    ``held_out`` with a held-out text), the three rows raw cut / bridged / healed
    (:func:`swapkl.healing.result.compare_bridged`) and the bridged model's per-window NLL sums."""
    from swapkl.healing.result import compare_bridged

    rec = hb.to_dict()
    result.contract = dict(result.contract, repair=rec)
    rows = {}
    for name, r in res.items():
        nll = {role: r[role].nll for role in ("base", "pruned", "bridged", "healed")}
        rows[name] = dict(compare_bridged(nll, r["base"].counts), windows={"bridged": r["bridged"].nll.tolist()})
    result.repair = dict(rec, trainable_bridge_params=trainable_count(hb.bridges)
                         if result.recipe.get("part") == "bridge" else 0, **rows)
    return result
