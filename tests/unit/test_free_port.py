"""Ports for the tests' loopback daemons: never one an outgoing connection can take first, never one twice."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from hack.controlplane import processes


def test_ports_lie_outside_the_ephemeral_and_node_port_ranges_and_are_never_handed_out_twice() -> None:
    ephemeral = processes.ephemeral_port_range()
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports:
        assert port not in ephemeral, port
        assert port not in processes.NODE_PORT_RANGE, port
        assert port >= processes.LOWEST_PORT


def test_a_port_something_listens_on_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        monkeypatch.setattr(processes, "port_candidates", lambda _ephemeral: [busy])
        with pytest.raises(OSError, match="no free TCP port"):
            processes.free_port()


def test_the_ephemeral_range_is_read_from_the_kernel_setting(tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t50000\n")
    assert processes.ephemeral_port_range(setting) == range(40000, 50001)
    assert processes.ephemeral_port_range(tmp_path / "missing") == range(32768, 61000)


def test_an_ephemeral_range_that_leaves_no_room_is_an_error_that_says_what_to_change() -> None:
    with pytest.raises(OSError, match="ip_local_port_range 1024 65535 leaves only 0 ports"):
        processes.port_candidates(range(1024, 65536))
    low = processes.port_candidates(range(32768, 61000))
    assert low[0] == processes.LOWEST_PORT and 29999 in low and 30000 not in low and 61000 in low


def test_a_claim_blocks_other_callers_until_it_goes_stale(tmp_path: Path) -> None:
    assert processes._reserve(20000, tmp_path)
    assert not processes._reserve(20000, tmp_path)
    stale = time.time() - processes.RESERVATION_S - 1
    os.utime(tmp_path / "20000", (stale, stale))
    assert processes._reserve(20000, tmp_path)
    assert not processes._reserve(20000, tmp_path)
