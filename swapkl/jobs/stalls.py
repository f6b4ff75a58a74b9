"""A stall detector for a served dashboard (an operator's diagnostic, off unless ``SWAPKL_STALL_LOG`` names a file).

A Python thread re-arms :func:`faulthandler.dump_traceback_later` every 0.1 s.  faulthandler's timer runs in C,
without the GIL: when no Python thread of the server could run for ``limit_s`` seconds (a long call holding the
GIL, a garbage collection), it writes every thread's stack at that moment to the file -- the culprit is the one
that holds the GIL."""
from __future__ import annotations

import faulthandler
import threading
import time

_started = False


def watch_stalls(path: str, limit_s: float = 0.8) -> None:
    global _started
    if _started or not path:
        return
    _started = True
    f = open(path, "a", buffering=1)

    def _loop():
        while True:
            faulthandler.dump_traceback_later(limit_s, repeat=False, file=f, exit=False)
            time.sleep(0.1)

    threading.Thread(target=_loop, name="swapkl-stall-watch", daemon=True).start()
