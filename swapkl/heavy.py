"""The one place where the heavy modules -- torch, transformers and the classes a job resolves from it -- are
first imported in a process that runs several threads (the dashboard: a job worker, a warm-up thread and one
script thread per browser session).

transformers is a lazy module: ``from transformers import AutoModelForCausalLM`` imports the submodule on first
attribute access, and two threads doing that at once can see a half-initialised module (``ImportError: cannot
import name 'AutoModelForCausalLM' from 'transformers'``; reproduced here with five threads importing at once,
about one start in eight).  So:

* :func:`ensure` imports everything a job needs once, under one process-wide lock; every later caller returns at
  once, and a caller that comes while another thread is importing waits for it instead of racing it;
* :func:`start_background` runs :func:`ensure` on a daemon thread when the server starts (the first page paints
  meanwhile; the first Compute then finds everything imported), then moves the imported modules' objects out of
  the garbage collector's sight (``gc.freeze``: a full collection of them stalled every thread for ~1 s);
* :func:`exclusive` is the same lock as a context manager, for code that resolves further lazy transformers
  attributes (loading a model of another family, saving an export) while other threads may do the same.

No torch at import time: the CLI's ``--help`` and the dashboard's first paint import this module.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import threading

log = logging.getLogger("swapkl.heavy")

_LOCK = threading.RLock()  # re-entrant: a thread inside ensure() or exclusive() may import further
_READY = threading.Event()
_thread: threading.Thread | None = None
_THREAD_LOCK = threading.Lock()

#: third-party modules imported by :func:`ensure`, in order (swapkl's own torch modules are the caller's: the
#: dashboard's warm-up imports them after this, see :func:`swapkl.jobs.manager.warm_up`)
MODULES = ("torch", "transformers", "accelerate")
#: lazy transformers attributes resolved by :func:`ensure`: what loading any checkpoint touches, and the
#: built-in default's family (Llama)
ATTRIBUTES = ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer", "PreTrainedTokenizerFast",
              "LlamaForCausalLM", "LlamaConfig")


def ensure() -> None:
    """Import :data:`MODULES` and resolve :data:`ATTRIBUTES` of transformers, once per process, under the lock.
    Raises what the import raised (the lock is released; a later call tries again)."""
    if _READY.is_set():
        return
    with _LOCK:
        if _READY.is_set():
            return
        for name in MODULES:
            importlib.import_module(name)
        import transformers

        for attr in ATTRIBUTES:
            getattr(transformers, attr)
        from transformers.utils import logging as _hf_logging  # noqa: F401  (checkpoints uses it)
        _READY.set()


def ready() -> bool:
    """Whether :func:`ensure` has completed in this process."""
    return _READY.is_set()


@contextlib.contextmanager
def exclusive():
    """Hold the import lock (after :func:`ensure`): for code that may resolve further lazy transformers
    modules -- loading a checkpoint, saving an export -- while other threads run."""
    ensure()
    with _LOCK:
        yield


def start_background(then=None) -> threading.Thread:
    """Run :func:`ensure` (and then ``then()``, e.g. imports of the caller's own torch modules, under the same
    lock) on a daemon thread, once per process; later calls return the same thread.  A failure is logged; the
    job that needs the modules calls :func:`ensure` again and reports the real error."""
    global _thread
    with _THREAD_LOCK:
        if _thread is not None:
            return _thread

        def _run():
            try:
                with exclusive():
                    if then is not None:
                        then()
                # the ~500,000 objects of the imported modules live as long as the process: out of the
                # collector's sight, a full collection costs microseconds instead of ~1 s (measured with torch,
                # transformers, streamlit and a model loaded), which stalled every thread of the server --
                # its health answers included -- once in a while
                gc.freeze()
            except Exception as e:
                log.warning("warm-up import failed: %s", e)

        _thread = threading.Thread(target=_run, name="swapkl-warm-up", daemon=True)
        _thread.start()
        return _thread
