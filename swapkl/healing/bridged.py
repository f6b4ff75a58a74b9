"""Healing after a linear bridge (``heal --repair bridge``, docs/healing.md "Healing after a bridge").

The heal starts from the *bridged* model (:func:`swapkl.repair.bridge.bridged_model`): every maximal span of the
removed set is replaced by a d×d map ``W`` fitted by least squares on calibration text (:mod:`swapkl.repair`).  The
calibration windows are drawn from the evaluation corpus's prompt region, outside the scoring prompts (checked by
:func:`swapkl.repair.calibration.calibration_text`), and the heal's training chunks are cut around them
(:func:`swapkl.healing.text.corpus_train_text`'s ``avoid``; :func:`swapkl.healing.text.check_disjoint` asserts it);
the evaluation region and a held-out text are disjoint from the prompt region by construction / by the shingle check.

``--train bridge`` trains the matrices too, with LoRA: each ``W`` is a trainable float32 parameter of a
:class:`BridgeMap` initialised at its least-squares fit, hooked where its form acts:

where its form hooks it (:meth:`~swapkl.repair.forms.BridgeForm.attach_map`: the residual form in front of block j,
the folded one on the output of block i−1's MLP output projection, LoRA included).  Merged, a form that folds puts
the trained ``W`` into its weights exactly as the least-squares one (:func:`merge_with_maps`), so a folded
bridge-trained heal exports as an ordinary checkpoint; a form that does not export is refused in one line
(:func:`check_exportable`).  The bridges come from one :class:`~swapkl.repair.bridger.Bridger` per heal session.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from swapkl.contract import stable_hash
from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.repair.bridge import Bridge, new_index, spans_of

#: the attribute name a :class:`BridgeMap` is registered under on the module it hooks
MAP_NAME = "swapkl_bridge"


@dataclass(frozen=True)
class HealBridge:
    """The bridges one heal starts from: ``bridges`` (one :class:`~swapkl.repair.bridge.Bridge` per span of the
    removed set, in span order), ``settings`` (:class:`~swapkl.repair.settings.BridgeSettings` as a dict),
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


def check_exportable(bridges) -> None:
    """Refuse (one line) an export of a model with a bridge whose form is no module of a stock checkpoint
    (:meth:`~swapkl.repair.forms.BridgeForm.export_refusal`)."""
    for b in bridges or ():
        why = b.kind.export_refusal(b)
        if why:
            raise SwapklError(why)


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


def _sites(model: torch.nn.Module, bridges, num_layers: int) -> list:
    """``[(bridge, the module its form acts on)]`` in the pruned ``model`` (``num_layers``: the source's count)."""
    loc = arch.locate(model)
    index = new_index(bridges)
    return [(b, b.kind.site(loc, b, index, num_layers)) for b in bridges]


def attach_maps(model: torch.nn.Module, bridges, num_layers: int) -> list[BridgeMap]:
    """Hook one :class:`BridgeMap` per bridge onto ``model`` (the pruned model, changed in place; under peft its
    base model, after LoRA is applied, so a folded map acts on the LoRA-adapted projection's output); returns the
    maps in bridge order.  ``num_layers``: the source model's block count."""
    dev = next(model.parameters()).device
    maps = []
    for b, site in _sites(model, bridges, num_layers):
        m = BridgeMap(b.W, dev)
        b.kind.attach_map(site, m)
        site.add_module(MAP_NAME, m)
        maps.append(m)
    return maps


def trained_bridges(model: torch.nn.Module, bridges, num_layers: int) -> list[Bridge]:
    """The bridges with the ``W`` (float64 numpy) of the :class:`BridgeMap` modules :func:`attach_maps` hooked onto
    ``model`` (under peft: its base model)."""
    out = []
    for b, site in _sites(model, bridges, num_layers):
        m = getattr(site, MAP_NAME, None)
        if not isinstance(m, BridgeMap):
            raise SwapklError(f"internal: no bridge map on the model for the span [{b.start}, {b.end})")
        out.append(Bridge(b.start, b.end, b.form, m.W.detach().double().cpu().numpy(), dict(b.fit, trained=True)))
    return out


def merge_with_maps(pm, bridges, num_layers: int) -> torch.nn.Module:
    """The LoRA merged (``merge_and_unload``) and every map merged by its form
    (:meth:`~swapkl.repair.forms.BridgeForm.merge`: a folded map into its projection, exact since it acts on that
    projection's whole output; a residual map stays hooked on its block, which survives the merge)."""
    trained = trained_bridges(pm.get_base_model(), bridges, num_layers)
    merged = pm.merge_and_unload()
    loc = arch.locate(merged)
    for b, site in _sites(merged, trained, num_layers):
        b.kind.merge(site, b, loc)
    return merged.eval()


def trainable_count(bridges) -> int:
    """Σ d² over the bridges: the parameters ``--train bridge`` adds to LoRA's."""
    return sum(int(b.W.shape[0]) * int(b.W.shape[1]) for b in bridges or ())


def prepare(shared: dict, model, tokenizer, corpus, removed, recipe, setup, settings) -> HealBridge | None:
    """The bridges of ``removed`` a heal with the repair ``settings`` (the plan's
    :class:`~swapkl.repair.settings.BridgeSettings`; None: no repair) starts from, from one
    :class:`~swapkl.repair.bridger.Bridger` per session ``shared`` (``shared["bridger"]``: its calibration
    text avoids the scoring prompts ``setup.prompts`` × ``setup.tokens`` from ``setup.prompt_seed``; the records per
    removed set under ``shared["bridges"]``).  Refuses (one line) ``--train bridge`` without the repair and QLoRA
    with it."""
    if settings is None:
        if recipe.part == "bridge":
            raise SwapklError("--train bridge trains the bridge matrices: it needs --repair bridge")
        return None
    if recipe.qlora:
        raise SwapklError("--qlora does not combine with --repair bridge")
    if "bridger" not in shared:
        from swapkl.contract import Contract
        from swapkl.repair.bridger import Bridger

        scoring = Contract(prompts=setup.prompts, tokens=setup.tokens, seed=setup.prompt_seed)
        shared["bridger"] = Bridger(model, tokenizer, corpus, settings, scoring)
    bridger = shared["bridger"]
    fits = shared.setdefault("bridges", {})
    key = tuple(sorted(int(i) for i in removed))
    if key not in fits:
        spans = spans_of(key)
        fits[key] = HealBridge(tuple(bridger.span_bridges(spans)), bridger.settings.to_dict(),
                               bridger.calibration(),
                               {f"{i}-{j}": why for (i, j), why in bridger.fallback_notes(spans).items()})
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
