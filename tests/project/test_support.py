"""The test suite's own machinery that parallel runs depend on: each pytest-xdist worker draws server ports from its
own slice (support.browser_util.free_port), so two workers never start servers on the same port."""
from __future__ import annotations

import socket

import pytest
from support.browser_util import PORTS, PORTS_PER_WORKER, free_port


def test_each_worker_draws_free_ports_from_its_own_slice(monkeypatch):
    seen = {}
    for k in (0, 1, 2, 7):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{k}")
        start = 20000 + 750 * k
        ports = {free_port() for _ in range(20)}
        assert all(start <= p < start + 750 for p in ports), (k, sorted(ports))
        seen[k] = ports
    assert not set.intersection(*seen.values())
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert all(20000 <= free_port() < 32000 for _ in range(20))
    assert (PORTS.start, PORTS.stop, PORTS_PER_WORKER) == (20000, 32000, 750)  # below Linux's ephemeral 32768-60999


def test_a_port_in_use_is_never_drawn(monkeypatch):
    """Every port of gw3's slice but one is taken: free_port finds the one that is free; with none, it says so."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    start = 20000 + 750 * 3
    held, free = [], None
    for p in range(start, start + 750):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            s.listen()
        except OSError:  # already used by some other process on this machine
            s.close()
            continue
        if free is None:
            s.close()
            free = p
            continue
        held.append(s)
    try:
        assert free is not None and len(held) > 700  # the machine leaves most of the slice free
        assert {free_port() for _ in range(5)} == {free}
        held.append(socket.create_server(("127.0.0.1", free)))
        with pytest.raises(RuntimeError, match="no free port"):
            free_port()
    finally:
        for s in held:
            s.close()
