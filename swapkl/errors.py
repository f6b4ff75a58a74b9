"""User-facing errors.  Anything raised as a :class:`SwapklError` is a one-line message for the user (the CLI
prints it and exits 2; the dashboard shows it); anything else is a bug.  :func:`is_oom` is the one test for an
out-of-memory error (the engine retries with a smaller batch, the CLI and the dashboard give advice)."""
import sys


class SwapklError(Exception):
    """Bad input or an unmet precondition, with a message a user can act on."""


class PolicyError(SwapklError):
    """A request that the server's policy (demo mode, :mod:`swapkl.jobs.policy`) does not allow."""


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
#: distribution to install}.  tests/project/test_packaging.py checks this table against pyproject and every import.
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


#: lower-cased pieces of the messages that out-of-memory errors carry when they do not arrive as
#: ``torch.OutOfMemoryError``: the CUDA runtime and driver ("CUDA error: out of memory", "CUDA driver error: out of
#: memory", NCCL's "Cuda failure 'out of memory'", HIP/MPS/XPU "... out of memory"), the CUDA libraries' allocation
#: failures (cuBLAS handle or workspace: "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`";
#: cuDNN, cuSOLVER, cuSPARSE, cuFFT), the enum names some wrappers print, and torch's CPU allocator
#: ("DefaultCPUAllocator: can't allocate memory: you tried to allocate ... bytes", "... not enough memory ...").
OOM_MESSAGES = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed",
                "cusolver_status_alloc_failed", "cusparse_status_alloc_failed", "cufft_alloc_failed",
                "cuda_error_out_of_memory", "cudaerrormemoryallocation", "can't allocate memory",
                "not enough memory")


def is_oom(err: BaseException) -> bool:
    """True for an out-of-memory error of any device: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA or CPU
    allocator), or a ``RuntimeError`` whose message carries one of :data:`OOM_MESSAGES` (the CUDA runtime, a CUDA
    library or the CPU allocator, older torch, other backends), also when it is the cause of the error raised
    (``raise ... from``: a compiler or a hook that wrapped it).  Not a :class:`SwapklError` (already explained,
    e.g. out of memory at one row), not "illegal memory access", not triton's "out of resource: shared memory"
    (a smaller batch would not help).  torch is consulted only when already imported (this module stays
    import-light)."""
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, SwapklError):
            return False  # already explained to the user (DeviceOutOfMemory at one row): never retried
        if isinstance(err, MemoryError) or (oom_type is not None and isinstance(err, oom_type)):
            return True
        if isinstance(err, RuntimeError) and any(m in str(err).lower() for m in OOM_MESSAGES):
            return True
        err = err.__cause__  # `raise Wrapper(...) from oom` (not the context of an unrelated error)
        seen += 1
    return False
