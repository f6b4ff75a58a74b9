"""The sublayer layouts swapkl knows, as data (``data/layouts.json``, read through :mod:`swapkl.model.knowledge`):
where a block keeps its attention and MLP units (docs of :mod:`swapkl.model.units`), and silencing a unit by zeroing
its output projection(s)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from swapkl.contract import BLOCK, SUBLAYERS, check_unit
from swapkl.model import knowledge
from swapkl.model.knowledge import KnowledgeError


@dataclass(frozen=True)
class SublayerSpec:
    """One sublayer unit of a block: ``modules`` (its weights, norms included), ``out`` (the output
    projection(s) zeroed to skip it), ``core`` (the module whose output is the residual branch)."""

    modules: tuple[str, ...]
    out: tuple[str, ...]
    core: str
    #: modules of the unit that also feed the other unit (a parallel block's one norm): kept when the unit is skipped
    shared: tuple[str, ...] = ()


@dataclass(frozen=True)
class UnitLayout:
    """Where a block keeps its attention and MLP sublayer units (paths relative to one block)."""

    name: str
    attention: SublayerSpec
    mlp: SublayerSpec
    notes: str = ""

    def spec(self, unit: str) -> SublayerSpec:
        if check_unit(unit) == BLOCK:
            raise ValueError("a block is not a sublayer unit")
        return getattr(self, unit)


def spec_from(data, where: str) -> SublayerSpec:
    """A :class:`SublayerSpec` from its description (``{"modules": [...], "out": [...], "core": "...", "shared":
    [...]}``, ``shared`` optional); raises :class:`~swapkl.model.knowledge.KnowledgeError` naming the key."""
    if not isinstance(data, Mapping):
        raise KnowledgeError(f"{where}: a unit is a JSON object with modules, out and core")
    unknown = sorted(set(data) - {"modules", "out", "core", "shared"})
    if unknown:
        raise KnowledgeError(f"{where}: unknown key '{unknown[0]}' (known: modules, out, core, shared)")
    got = {}
    for key in ("modules", "out", "shared"):
        value = data.get(key, ())
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value) or (
                key != "shared" and not value):
            raise KnowledgeError(f"{where}: key '{key}' must be a list of non-empty strings")
        got[key] = tuple(value)
    if not isinstance(data.get("core"), str) or not data["core"]:
        raise KnowledgeError(f"{where}: key 'core' must be a non-empty string")
    return SublayerSpec(got["modules"], got["out"], data["core"], got["shared"])


def layout_from(name: str, data, where: str) -> UnitLayout:
    """A :class:`UnitLayout` named ``name`` from its description (one unit per sublayer of
    :data:`swapkl.contract.SUBLAYERS`, and ``notes``; units as :func:`spec_from` reads them); raises :class:`~swapkl.model.knowledge.KnowledgeError` naming the key."""
    if not isinstance(data, Mapping):
        raise KnowledgeError(f"{where}: a layout is a JSON object with a unit per sublayer")
    unknown = sorted(set(data) - {*SUBLAYERS, "notes"})
    if unknown:
        raise KnowledgeError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(SUBLAYERS)}, notes)")
    for key in SUBLAYERS:
        if key not in data:
            raise KnowledgeError(f"{where}: key '{key}' is missing")
    if not isinstance(data.get("notes", ""), str):
        raise KnowledgeError(f"{where}: key 'notes' must be a string")
    units = {u: spec_from(data[u], f"{where}.{u}") for u in SUBLAYERS}
    return UnitLayout(name, *(units[u] for u in SUBLAYERS), notes=data.get("notes", ""))


#: every layout swapkl knows (``data/layouts.json``; a family names one in ``Family.units``; the generic fallback
#: tries them in this order and keeps the first that validates)
LAYOUTS: dict[str, UnitLayout] = {name: layout_from(name, d, f"layouts.json: layouts.{name}")
                                  for name, d in knowledge.mapping("layouts", "layouts", Mapping).items()}


def representatives(blocks) -> list[int]:
    """The index of the first block of each structure (modules' names and classes): a dense block and an MoE block
    are two structures, a uniform stack one."""
    seen: dict = {}
    for k, b in enumerate(blocks):
        seen.setdefault(tuple((n, type(m).__name__) for n, m in b.named_modules()), k)
    return list(seen.values())


def _get(root: torch.nn.Module, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def out_tensors(block: torch.nn.Module, path: str) -> list[tuple[torch.nn.Module, str]]:
    """The tensors an output path names, as ``(owning module, parameter name)``: a projection module's ``weight``
    and ``bias``, or one parameter (MoE experts keep their down projections as ``[E, d, I]`` parameters)."""
    obj = _get(block, path)
    if isinstance(obj, torch.nn.Module):
        return [(obj, n) for n in ("weight", "bias") if isinstance(obj._parameters.get(n), torch.Tensor)]
    parent_path, _, attr = path.rpartition(".")
    parent = _get(block, parent_path) if parent_path else block
    return [(parent, attr)] if isinstance(obj, torch.Tensor) else []


def zero_out(block: torch.nn.Module, layout: UnitLayout, unit: str) -> None:
    """Set the output projection(s) of ``unit`` in ``block`` to zero (weight and bias, or the experts' down
    projections), in place: exactly skipping that residual sublayer.  ``block`` must be a private copy (never a
    shared model's block)."""
    with torch.no_grad():
        for path in layout.spec(unit).out:
            for mod, name in out_tensors(block, path):
                mod._parameters[name].zero_()
