"""User-facing errors.  Anything raised as a :class:`SwapklError` is a one-line message for the user (the CLI
prints it and exits 2; the dashboard shows it); anything else is a bug.  :func:`is_oom` is the one test for an
out-of-memory error (the engine retries with a smaller batch, the CLI and the dashboard give advice)."""
import sys


class SwapklError(Exception):
    """Bad input or an unmet precondition, with a message a user can act on."""


class ModelLoadError(SwapklError):
    """Unknown model id or revision, missing path, unreadable weights."""


class ContractError(SwapklError):
    """An impossible or inconsistent evaluation setting (pair set, prompts, budget, ...)."""


class ComputeInterrupted(SwapklError):
    """A computation stopped by its caller; what finished is in the cache."""


class OutputPathError(SwapklError):
    """An output path that cannot be written, or whose writing would destroy an input or unrelated files."""


class MissingDependency(SwapklError):
    """An optional package that this operation needs is not installed (:func:`require_extra`)."""


#: the optional features of ``pyproject.toml``'s ``[project.optional-dependencies]``: extra -> {module imported:
#: distribution to install}.  tests/test_packaging.py checks this table against pyproject and every import.
EXTRAS = {
    "tasks": {"lm_eval": "lm-eval"},
    "heal": {"peft": "peft"},
    "qlora": {"bitsandbytes": "bitsandbytes"},  # with "heal" for `heal --qlora`; alone for `evidence --compare-dtype 4bit`
}


def missing_modules(extra: str) -> list[str]:
    """The distributions of ``extra`` (:data:`EXTRAS`) whose module cannot be found (nothing is imported)."""
    import importlib.util

    out = []
    for module, dist in EXTRAS[extra].items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or half-imported package: as good as absent
            found = False
        if not found:
            out.append(dist)
    return out


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`MissingDependency` (one line: ``"<what> needs lm-eval: install swapkl[tasks]"``) unless every
    package of the optional feature ``extra`` is installed; call it before the work that imports them."""
    missing = missing_modules(extra)
    if missing:
        raise MissingDependency(f"{what} needs {' and '.join(missing)}: install swapkl[{extra}]")


class UploadError(SwapklError):
    """A result, curves or scores file from outside (browser upload, ``--scores``/``--curves``, a saved file) that
    is not valid; the message names the file and the field (see :mod:`swapkl.schema`)."""


def is_oom(err: BaseException) -> bool:
    """True for an out-of-memory error of any device: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA or
    CPU allocator), or a ``RuntimeError`` whose message says "out of memory" (older torch / other backends).
    torch is consulted only when already imported (this module stays import-light)."""
    if isinstance(err, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(err, oom_type):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()
