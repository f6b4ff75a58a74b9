"""A content fingerprint of a checkpoint spec without loading the model: what a job key and a study's cached
row name a model by.

:func:`quick_fingerprint` (a job's key) and :func:`offline_identity` (a study row's key): both read files only --
a local folder's config and weight files, a GGUF file, the built-in default's GGUF and its package version, a hub
id's commit as the local Hugging Face cache resolves it (no network)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from swapkl.model import builtin
from swapkl.store import file_sha256, folder_fingerprint

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def quick_fingerprint(model: str, revision: str | None = None) -> str:
    """A content fingerprint of a checkpoint spec without loading the model (sha256s are memoised on disk):
    built-in / GGUF: the GGUF file's sha256; local folder: its config + weight files; hub: ``id@revision``.
    Raises :class:`~swapkl.errors.ModelLoadError` for a missing path."""
    from swapkl.model.checkpoints import parse_spec  # deferred: swapkl.checkpoints imports torch

    sp = parse_spec(model, revision)
    if sp.kind == "builtin":
        return "builtin:" + file_sha256(builtin.default_gguf_path())
    if sp.kind == "gguf":
        return "gguf:" + file_sha256(sp.source)
    if sp.kind == "local":
        return "local:" + folder_fingerprint(sp.source)
    return f"hub:{sp.source}@{sp.revision or 'main'}"


def offline_identity(model: str, revision: str | None = None) -> str | None:
    """What ``model`` is, from its files alone (nothing loaded, no network): built-in: its GGUF's sha256 and the
    package version; GGUF: the file's sha256; local folder: its config and weight files; hub: ``id@commit``,
    the commit the local Hugging Face cache resolves the revision to (a 40-hex revision is its own commit).
    None where that cannot be known without loading (a hub revision the local cache has no ref of).  Raises
    :class:`~swapkl.errors.ModelLoadError` for a missing path."""
    from swapkl.model.checkpoints import parse_spec

    sp = parse_spec(model, revision)
    if sp.kind == "builtin":
        return f"builtin:{file_sha256(builtin.default_gguf_path())}:{_package_version()}"
    if sp.kind != "hub":
        return quick_fingerprint(model, revision)
    commit = cached_commit(sp.source, sp.revision)
    return f"hub:{sp.source}@{commit}" if commit else None


def hub_identity(hub_id: str, commit: str | None) -> str | None:
    """The identity :func:`offline_identity` gives a hub model whose ``commit`` a load reported (None: unknown)."""
    return f"hub:{hub_id}@{commit}" if commit else None


def cached_commit(hub_id: str, revision: str | None) -> str | None:
    """The commit the local Hugging Face cache resolves ``revision`` (default ``main``) of ``hub_id`` to: a
    40-hex revision itself, else the cache's ``refs/<revision>`` file; None when the cache has no such ref."""
    rev = revision or "main"
    if _COMMIT.match(rev):
        return rev
    ref = hub_cache() / ("models--" + hub_id.replace("/", "--")) / "refs" / rev
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if _COMMIT.match(commit) else None


def hub_cache() -> Path:
    """The local Hugging Face hub cache as huggingface_hub finds it: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` (default ``~/.cache``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _package_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(builtin.DISTRIBUTION)
    except PackageNotFoundError:
        return builtin.DISTRIBUTION_VERSION
