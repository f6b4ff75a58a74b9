"""The sublayer layouts swapkl knows, as data: where a block keeps its attention and MLP units (docs of
:mod:`swapkl.model.units`), and silencing a unit by zeroing its output projection(s)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from swapkl.contract import BLOCK, check_unit


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


#: every layout swapkl knows, as data (a family names one in ``Family.units``; the generic fallback tries them in
#: this order and keeps the first that validates)
LAYOUTS: dict[str, UnitLayout] = {
    "sandwich": UnitLayout(
        name="sandwich",
        attention=SublayerSpec(("input_layernorm", "self_attn", "post_attention_layernorm"), ("self_attn.o_proj",),
                               "self_attn"),
        mlp=SublayerSpec(("pre_feedforward_layernorm", "mlp", "post_feedforward_layernorm"), ("mlp.down_proj",), "mlp"),
        notes="Gemma 2/3: a norm before and after each sublayer (post_attention_layernorm belongs to attention here)."),
    "pre-norm": UnitLayout(
        name="pre-norm",
        attention=SublayerSpec(("input_layernorm", "self_attn"), ("self_attn.o_proj",), "self_attn"),
        mlp=SublayerSpec(("post_attention_layernorm", "mlp"), ("mlp.down_proj",), "mlp"),
        notes="Llama / Mistral / Qwen2/3 / SmolLM (and Gemma 1, OLMo): h + attn(norm1(h)), then + mlp(norm2(.))."),
    "gpt-neox": UnitLayout(
        name="gpt-neox",
        attention=SublayerSpec(("input_layernorm", "attention"), ("attention.dense",), "attention"),
        mlp=SublayerSpec(("post_attention_layernorm", "mlp"), ("mlp.dense_4h_to_h",), "mlp"),
        notes="GPT-NeoX / Pythia: parallel residual (use_parallel_residual): both sublayers read the block input."),
    "gpt2": UnitLayout(
        name="gpt2",
        attention=SublayerSpec(("ln_1", "attn"), ("attn.c_proj",), "attn"),
        mlp=SublayerSpec(("ln_2", "mlp"), ("mlp.c_proj",), "mlp"),
        notes="GPT-2: pre-norm, Conv1D projections (weight [in, out])."),
    "opt": UnitLayout(
        name="opt",
        attention=SublayerSpec(("self_attn_layer_norm", "self_attn"), ("self_attn.out_proj",), "self_attn"),
        mlp=SublayerSpec(("final_layer_norm", "fc1", "fc2"), ("fc2",), "fc2"),
        notes="OPT with do_layer_norm_before (a post-norm OPT fails validation: skipping is not zeroing there)."),
}


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
