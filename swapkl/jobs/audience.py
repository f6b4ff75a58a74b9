"""Who waits for which job: the browser sessions that showed a job's live view.  A job whose every watcher has
gone (closed the tab, lost the connection) for ``grace_s`` seconds is abandoned: the manager cancels it, so a
room that left does not keep the machine busy (finished pairs stay in the cache).  A job nobody ever watched
(the library, the CLI, a test) is never abandoned.  ``alive(session)`` answers whether a session is still
connected (the dashboard passes Streamlit's runtime; no Streamlit here)."""
from __future__ import annotations

import threading
import time
from typing import Callable


class Audience:
    def __init__(self, alive: Callable[[str], bool] | None = None, grace_s: float = 15.0):
        self.alive = alive
        self.grace_s = float(grace_s)
        self._watchers: dict[str, dict[str, float]] = {}  # job key -> {session: last seen (monotonic s)}
        self._gone_since: dict[str, float] = {}  # job key -> when no watcher was found connected (monotonic s)
        self._lock = threading.Lock()

    def watch(self, key: str, session: str) -> None:
        """``session`` shows job ``key`` now."""
        with self._lock:
            self._watchers.setdefault(key, {})[session] = time.monotonic()

    def watchers(self, key: str) -> list[str]:
        """The sessions that are connected and have shown job ``key``."""
        with self._lock:
            sessions = list(self._watchers.get(key, {}))
        return [s for s in sessions if self._alive(s)]

    def abandoned(self, key: str) -> bool:
        """True when job ``key`` had watchers and none of them has been connected for ``grace_s`` seconds, as
        seen by the calls of this method (a refresh reconnects as a new session within that time and watches
        again).  Called every few seconds by the manager's monitor."""
        if self.alive is None:
            return False
        with self._lock:
            seen = list(self._watchers.get(key, {}))
        now = time.monotonic()
        if not seen or any(self._alive(s) for s in seen):
            with self._lock:
                self._gone_since.pop(key, None)
            return False
        with self._lock:
            since = self._gone_since.setdefault(key, now)
        return now - since >= self.grace_s

    def forget(self, key: str) -> None:
        with self._lock:
            self._watchers.pop(key, None)
            self._gone_since.pop(key, None)

    def _alive(self, session: str) -> bool:
        try:
            return bool(self.alive(session)) if self.alive is not None else True
        except Exception:  # a liveness probe that fails must not cancel anybody's job
            return True
