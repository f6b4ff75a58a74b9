"""User-facing errors.  Anything raised as a :class:`SwapklError` is a one-line message for the user (the CLI
prints it and exits 2; the dashboard shows it); anything else is a bug."""


class SwapklError(Exception):
    """Bad input or an unmet precondition, with a message a user can act on."""


class ModelLoadError(SwapklError):
    """Unknown model id or revision, missing path, unreadable weights."""


class ContractError(SwapklError):
    """An impossible or inconsistent evaluation setting (pair set, prompts, budget, ...)."""


class CacheError(SwapklError):
    """A cache entry that cannot be used."""


class ComputeInterrupted(SwapklError):
    """A computation stopped by its caller; what finished is in the cache."""


class OutputPathError(SwapklError):
    """An output path that cannot be written, or whose writing would destroy an input or unrelated files."""


class UploadError(SwapklError):
    """A result, curves or scores file from outside (browser upload, ``--scores``/``--curves``, a saved file) that
    is not valid; the message names the file and the field (see :mod:`swapkl.schema`)."""
