"""A room of colleagues on a fresh demo server, in real browsers (Debian's Chromium through selenium).

Phase 1: four visitors open the page within 4 s of each other, keep every default and press Compute: one
computation, shared, and every one of them reaches Done (a first-import race once gave all four an ImportError).
Phase 2: four more with three different contracts: queued jobs tell their visitor how many computations are
ahead; a visitor who leaves mid-run does not stop the job another visitor waits for; a job whose only visitor left
is cancelled.  Throughout, ``/_stcore/health`` answers in under 1 s (a poll that took longer counts against the dashboard only
when a do-nothing control server polled right after it answered at once; one in a hundred such polls is
tolerated, none of 5 s) and the model is loaded once.

The fast version of ``benchmarks/visitors.py`` (which runs the default model with K = 1, 4, 8)."""
from __future__ import annotations

import os
import re
from pathlib import Path

from support.browser_util import free_port, need_browser, served, streamlit_cmd

need_browser()

from support.visitors import Visitor, computations, room  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def contract(prompts: int, tokens: int, budget: int = 0) -> str:
    """A visitor's settings as a shared link's query string: prompts x tokens, no curves (the room tests sharing
    and queueing, not curves)."""
    return f"?prompts={prompts}&tokens={tokens}&budget={budget}"


def test_a_room_of_visitors(tmp_path, stories_path):
    cache = tmp_path / "cache"
    port = free_port()
    env = dict(os.environ, SWAPKL_CACHE=str(cache), HF_HUB_OFFLINE="1", SWAPKL_DEMO="1",
               SWAPKL_DEMO_MODELS=os.path.relpath(stories_path, ROOT), SWAPKL_DEMO_MAX_PROMPT_TOKENS="70000",
               SWAPKL_ABANDON_S="2")
    log = cache / "logs" / "dashboard.log"
    with served(streamlit_cmd(port), ROOT, env, tmp_path / "server.log", port, timeout=120) as (url, proc):
        # phase 1: the case -- everybody keeps the defaults (through a shared link with a budget that a
        # 5-layer model allows: the default budget, 4, is the 30-layer default model's)
        room1 = [Visitor(f"default-{k}", query="?budget=2") for k in range(4)]
        f1 = room(url, proc.pid, room1, tmp_path / "room1", spread_s=4.0, timeout=300)
        assert all(v.error is None and v.done is not None for v in room1), [(v.name, v.error) for v in room1]
        assert computations(log) == 1                      # one computation, shared by the four

        # phase 2: different contracts, two visitors leave early
        room2 = [Visitor("A-leaves", query=contract(250, 256), leave_after_s=4, expect="250×256"),
                 Visitor("A-stays", query=contract(250, 256), expect="250×256"),
                 Visitor("B", query=contract(251, 256), expect="251×256"),
                 Visitor("C-leaves", query=contract(252, 256), leave_after_s=4, expect="252×256")]
        f2 = room(url, proc.pid, room2, tmp_path / "room2", spread_s=2.0, timeout=400)
        by = {v.name: v for v in room2}
        assert by["A-stays"].done is not None, by["A-stays"].error
        assert by["B"].done is not None, by["B"].error
        assert by["A-leaves"].left is not None and by["C-leaves"].left is not None
        # whichever of A and B reached the one computation slot second was queued and told so (A's visitors open
        # the page first, but which Compute click lands first depends on the machine's load)
        told = [v.name for v in room2 if any(re.search(r"queued: \d computations? ahead", t) for t in v.lines)]
        assert {"A-stays", "B"} & set(told), [(v.name, v.lines) for v in room2]
        text = log.read_text(encoding="utf-8")
        assert text.count("cancelled, nobody waits for it") == 1, text[-3000:]   # C: its only visitor left
        assert computations(log) in (3, 4)                 # A and B ran (C only if it started before the cancel)
        assert text.count("model loaded:") == 1            # one copy of the model for every session and contract
    for f in (f1, f2):
        # every health poll answered, none in 5 s or more (a server thread blocked by a computation or a model load
        # stalls for many seconds), and at most three in a hundred (two, on a short run) took 1 s or more while a
        # do-nothing server beside it answered at once (when both are slow the machine itself stalled: this 2-core
        # machine also runs four browsers and, under the README's command, two other test workers: 2 of 123 polls at
        # 1.0-1.4 s were seen so in a fresh clone's full run)
        assert f["health_failures"] == 0 and f["health_max_s"] < 5.0, f
        assert f["slow_server_only"] <= max(2, 3 * f["health_polls"] // 100), f
    print({"room1": f1, "room2": f2})
