"""A content fingerprint of a checkpoint spec without loading the model: what a job key and a study's cached
row name a model by."""
from __future__ import annotations

from swapkl.model import builtin
from swapkl.store import file_sha256, folder_fingerprint


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
