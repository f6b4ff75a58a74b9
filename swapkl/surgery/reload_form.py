"""The export's copy of a shortened model made what a reload of it builds, before it is checked and saved.

Stock ``transformers`` rebuilds a saved folder from the shortened config, block by block at the new positions, and
derives anew what the copy carries over from the full model:

* a constant a block derives from its index, which a kept block moved to a lower slot would come back with another
  value of (DiffLlama's ``λ_init = 0.8 − 0.6·exp(−0.3·i)``).  Where weights of the block absorb the change exactly,
  they are rewritten on the copy (new tensors: the caller's model is untouched) and the copy gets the constant a
  reload derives, so the reloaded block computes what the kept block computed: one class per constant, found by the
  module attribute's name (:data:`CONSTANTS`).  A constant without one still makes
  :func:`swapkl.model.config_cut.structure_difference` refuse the export in one line;
* which weights are tied (``_tied_weights_keys`` and its expanded ``all_tied_weights_keys``, per model class),
  declared with layer indices where layers share a block (Zamba's shared transformer): saving reads them to
  write each shared tensor once, so the copy takes them from the rebuilt model (:func:`adopt_ties`).

:func:`reload_form` does both on the model built on the ``meta`` device from the shortened config;
:func:`prepare_export` is the one step every export of a shortened stack takes before it writes (blocks removed,
merged, bridged or with sublayers zeroed): both, then the check that the reload rebuilds the kept blocks.
"""
from __future__ import annotations

import functools
import math

import torch

from swapkl.model import architectures as arch
from swapkl.model import knowledge
from swapkl.model.config_cut import rebuilt_model, reload_config, roundtrip_noise, settings, structure_difference
from swapkl.surgery.removal_set import PruneError


class PositionConstant:
    """One constant a block derives from its index (the module attribute :attr:`attr`) and how weights absorb it."""

    #: the module attribute holding the constant
    attr: str = ""

    def carry(self, module: torch.nn.Module, new: float) -> None:
        """Give ``module`` (a private copy) the constant ``new`` and weights with which it computes what it computed
        with its current constant; raises :class:`PruneError` (one line) when its weights cannot absorb it."""
        raise NotImplementedError


class DifferentialLambda(PositionConstant):
    """Differential attention (DiffLlama): ``λ = exp(q1·k1) − exp(q2·k2) + λ_init`` weighs the second attention map,
    and the output is ``o_proj((1 − λ_init) · groupnorm(·))``, its norm without weights.

    Moving ``λ_init`` from ``a`` to ``b``: the difference ``a − b`` moves into the first exponential when positive (its
    dot product ``q1·k1`` becomes ``log(exp(q1·k1) + a − b)``), else into the second (``q2·k2`` becomes
    ``log(exp(q2·k2) + b − a)``), so both stay positive and ``λ`` keeps its value; ``o_proj``'s weight is multiplied
    by ``(1 − a) / (1 − b)`` (its bias untouched).  Exact in real arithmetic; the new weights are rounded once to the
    model's dtype (``λ`` itself is computed in float32 by the model, either way)."""

    attr = "lambda_init"
    NEEDS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "o_proj")

    def carry(self, module, new):
        missing = [n for n in (self.attr, *self.NEEDS) if not hasattr(module, n)]
        if missing or not hasattr(module.o_proj, "weight") or 1.0 - new == 0.0:
            raise PruneError(f"{type(module).__name__}.lambda_init moves to {new}, and its weights cannot absorb it "
                             f"({'no ' + ', '.join(missing) if missing else 'an output scale of 1 − λ_init = 0'})")
        old = float(module.lambda_init)
        delta = old - new
        q, k = ("lambda_q1", "lambda_k1") if delta >= 0 else ("lambda_q2", "lambda_k2")
        qv, kv = (getattr(module, n).detach().double() for n in (q, k))
        target = math.log(math.exp(float((qv * kv).sum())) + abs(delta))
        for name, value in zip((q, k), with_dot(qv, kv, target)):
            _replace(module, name, value)
        _replace(module.o_proj, "weight", module.o_proj.weight.detach().double() * ((1.0 - old) / (1.0 - new)))
        module.lambda_init = new


def with_dot(q: torch.Tensor, k: torch.Tensor, target: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectors ``(q', k')`` (float64, the shape of ``q`` and ``k``) with ``q'·k' = target``: ``q`` moved along ``k``
    (else ``k`` along ``q``; both zero: ``±√(|target| / d)`` in every entry)."""
    kk, qq = float((k * k).sum()), float((q * q).sum())
    if kk > 0:
        return q + (target - float((q * k).sum())) / kk * k, k
    if qq > 0:
        return q, k + target / qq * q
    s = math.sqrt(abs(target) / q.numel())
    return torch.full_like(q, s), torch.full_like(k, math.copysign(s, target))


def _replace(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """``module``'s parameter ``name`` replaced by a new one holding ``value`` in the old one's dtype and device."""
    old = module._parameters[name]
    module._parameters[name] = torch.nn.Parameter(value.to(old.dtype).to(old.device), requires_grad=old.requires_grad)


#: every constant the export carries, by its module attribute's name
CONSTANTS: dict[str, PositionConstant] = {c.attr: c for c in (DifferentialLambda(),)}


def carry_constants(blocks, new_blocks) -> None:
    """On the shortened stack ``blocks`` (a private copy, in order): every constant of :data:`CONSTANTS` that the
    rebuilt stack ``new_blocks`` (same positions) holds another value of is carried into the block's weights.
    Nothing happens when the stacks differ in length (the structure check that follows refuses it)."""
    if new_blocks is None or len(new_blocks) != len(blocks):
        return
    for block, rebuilt in zip(blocks, new_blocks):
        have, want = settings(block), settings(rebuilt)
        for key, value in have.items():
            path, _, attr = key.rpartition(".")
            if attr in CONSTANTS and key in want and want[key] != value:
                CONSTANTS[attr].carry(block.get_submodule(path) if path else block, want[key])


#: the module attributes that declare tied weights (what saving reads to write a shared tensor once; data/config_keys.json)
TIE_ATTRS = knowledge.strings("config_keys", "tie_attrs")


def adopt_ties(copy: torch.nn.Module, built: torch.nn.Module) -> None:
    """Every module of ``copy`` (a private copy) that ``built`` has at the same path, of the same class, takes
    ``built``'s tie declarations (:data:`TIE_ATTRS`, copied); nothing when the two models are of other classes."""
    if type(copy) is not type(built):
        return
    mine = dict(copy.named_modules())
    for name, module in built.named_modules():
        target = mine.get(name)
        if target is None or type(target) is not type(module):
            continue
        for attr in TIE_ATTRS:
            if attr in vars(module):
                value = vars(module)[attr]
                setattr(target, attr, dict(value) if isinstance(value, dict) else value)


def reload_form(copy: torch.nn.Module, built: torch.nn.Module, blocks_path: str) -> None:
    """``copy`` (the export's private shortened copy) made what a reload builds, given ``built``, the model its
    shortened config builds on the ``meta`` device (:func:`swapkl.model.config_cut.rebuilt_model`): its position
    constants carried into its weights (:func:`carry_constants`), its tie declarations taken over
    (:func:`adopt_ties`)."""
    carry_constants(arch.get_path(copy, blocks_path), arch.get_path(built, blocks_path))
    adopt_ties(copy, built)


def prepare_export(model: torch.nn.Module, copy: torch.nn.Module, removed: list[int]):
    """Ready ``copy`` (the export's private copy of ``model`` with blocks ``removed`` gone, old indices) to be saved:
    made what a reload of its shortened config builds (:func:`reload_form`) and checked that it rebuilds the kept
    blocks (:func:`swapkl.model.config_cut.structure_difference`).  Returns the ``wrap`` of
    :func:`swapkl.surgery.outputs.save_model_folder` (None, or the wrapper config a stock reload needs:
    :func:`swapkl.model.config_cut.reload_config`); raises :class:`PruneError` in one line when the config cannot
    describe the shortened stack."""
    loc = arch.locate(model)
    path, n_src = loc.family.blocks, loc.num_layers
    kept = [i for i in range(n_src) if i not in set(removed)]
    noise = roundtrip_noise(loc.blocks, model.config, path, n_src, type(model))
    config = reload_config(copy.config, type(copy))
    built, why = rebuilt_model(config)  # what the saved folder reloads as
    if built is not None:
        reload_form(copy, built, path)
        why = structure_difference(arch.get_path(copy, path), kept, config, path, noise, built)
    if why is not None:
        raise PruneError(f"cannot export the model without layers {sorted(removed)}: {why}")
    return None if config is copy.config else functools.partial(reload_config, model_class=type(copy))
