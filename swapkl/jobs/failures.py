"""How a failed job explains itself: one line for the user and a kind (user / oom / bug)."""
from __future__ import annotations

from pathlib import Path

from swapkl.errors import SwapklError, is_oom


def readable_error(e: BaseException, phase: str, log_path: Path | None) -> tuple[str, str]:
    """``(one line for the user, kind)`` for an exception raised while ``phase`` ran; kind in
    {user, oom, bug}: a :class:`~swapkl.errors.SwapklError` message as is, out-of-memory
    (:func:`swapkl.errors.is_oom`) with advice, anything else with its type and a pointer to ``log_path``."""
    if isinstance(e, SwapklError):
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, "user"
    if is_oom(e):
        return (f"out of memory while {phase}: use fewer prompts or tokens, a smaller pair set or budget, "
                f"bfloat16, or a smaller model", "oom")
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    where = f"; traceback in {log_path}" if log_path else ""
    if isinstance(e, ImportError):  # already retried once (swapkl.jobs.runner): the environment is at fault
        todo = ("a module failed to import twice: press Compute to try again; if it fails again, restart the "
                "server (./run.sh) and check that requirements.txt is installed in its environment")
    else:
        todo = "press Compute to try again; if it fails again, please report it with the traceback"
    return f"unexpected error while {phase}: {type(e).__name__}: {first} — {todo}{where}", "bug"
