"""QLoRA (``Recipe(qlora=True)``, ``swapkl heal --qlora``): the same LoRA on a 4-bit copy of the (pruned) model.

* The guard (:func:`check_available`): CUDA and the ``bitsandbytes`` package, else one line.
* The base: the pruned copy written to a temporary folder and reloaded by transformers with
  ``BitsAndBytesConfig`` (:func:`bnb_config_kwargs`: NF4, double quantisation, compute dtype bfloat16) on the first
  CUDA device, then ``peft.prepare_model_for_kbit_training`` (norms and head in float32, gradient checkpointing,
  input gradients); :func:`swapkl.healing.train.lora_model` puts the recipe's LoRA on it, as for plain LoRA.
* The healed model and the export: the trained adapter is folded into the **original-precision** weights of the
  pruned model (a dequantised merge: ``merge_and_unload`` on a full-precision copy, never into 4-bit weights), so the
  merged folder reloads like any other; the adapter alone is written too.  The merged model is not the 4-bit model
  the adapter was trained on (its base weights are the unquantised ones): the heal measures the merged model.

Written against transformers' and peft's documented QLoRA path; it has **not been run on a GPU in this project**
(the development machines have none).  Tested on CPU: the guard, the configuration, and the plumbing with the
4-bit load replaced by a plain one (``DEVICE_MAP`` and :func:`bnb_config` patched).
"""
from __future__ import annotations

import tempfile

from swapkl.errors import ContractError, require_extra

# Deferred imports: torch, transformers, peft and bitsandbytes are imported by the functions that need them.

#: where the 4-bit model is loaded (transformers' device_map): the first CUDA device
DEVICE_MAP = {"": 0}


def bnb_config_kwargs() -> dict:
    """The arguments of ``transformers.BitsAndBytesConfig`` for the 4-bit base (the compute dtype by name)."""
    return {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16"}


def bnb_config():
    """The ``BitsAndBytesConfig`` passed to ``from_pretrained`` (built without CUDA; loading with it needs CUDA)."""
    import torch
    from transformers import BitsAndBytesConfig

    kw = bnb_config_kwargs()
    kw["bnb_4bit_compute_dtype"] = getattr(torch, kw["bnb_4bit_compute_dtype"])
    return BitsAndBytesConfig(**kw)


def check_available(cuda: bool | None = None) -> None:
    """Raise :class:`ContractError` (one line) unless CUDA is present, :class:`MissingDependency` unless peft and
    bitsandbytes are (``cuda``: override the CUDA check, for tests)."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda:
        raise ContractError("QLoRA (4-bit base weights through bitsandbytes) needs CUDA; this machine has none")
    require_extra("heal", "QLoRA")
    require_extra("qlora", "QLoRA (4-bit base weights)")


def quantized_copy(model, removed):
    """The model without blocks ``removed``, reloaded 4-bit (:func:`bnb_config`) on CUDA device 0 and prepared for
    k-bit training.  Its own tensors: the caller's model is not changed."""
    check_available()
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    from swapkl.surgery.blocks import pruned_copy

    with tempfile.TemporaryDirectory(prefix="swapkl-qlora-") as tmp:
        pruned_copy(model, list(removed)).save_pretrained(tmp, safe_serialization=True)
        q = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb_config(), device_map=DEVICE_MAP,
                                                 dtype=torch.bfloat16, trust_remote_code=False)
    return prepare_model_for_kbit_training(q, use_gradient_checkpointing=True)
