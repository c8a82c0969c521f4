"""Start, identify and stop the control-plane daemons without ever hitting a stranger.

Daemons run in their own session (process group), so stopping a group also
stops anything they spawned. A pid read back from a state file is only
signalled if /proc still shows the same executable we started: pids get reused.

``free_port`` and ``stop_child`` serve every loopback process of the tests too
(Prometheus, the operator, ``metainfer serve``): those are children of the
calling process, so their Popen is all it takes to stop them.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def launch(name: str, argv: list[str], log_dir: Path, *, die_with_parent: bool = False) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, logging to ``log_dir/<name>.log``.

    ``die_with_parent`` (Linux) makes the kernel SIGTERM the daemon when the
    starting process dies, even by SIGKILL: right for a test session, wrong for
    ``cluster up``, whose daemons must outlive the command.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )


# Kubernetes' default NodePort range: a Service of the test cluster may claim these on the host.
NODE_PORT_RANGE = range(30000, 32768)
# Registered services cluster below this; nothing of ours needs a port there.
LOWEST_PORT = 10000
# How long a port handed out stays promised to its caller before another process may take it:
# long enough for the slowest daemon to bind, after which the listening socket itself keeps others off.
RESERVATION_S = 600.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on and no other caller was just given.

    A port the kernel hands out for ``bind(0)`` lies in the ephemeral range, which every
    outgoing connection also draws its source port from: between our pick and the daemon's
    bind, a client connection could take it (etcd then dies with "address already in use").
    So ports come from outside that range and outside the NodePort range, at random, and each
    is claimed by a file in the temp directory so that parallel test lanes never share one.
    """
    candidates = port_candidates(ephemeral_port_range())
    rng = random.SystemRandom()
    for _ in range(256):
        port = rng.choice(candidates)
        if _reserve(port) and _bindable(port):
            return port
    raise OSError(f"no free TCP port on 127.0.0.1 among {len(candidates)} candidates outside the ephemeral range")


def ephemeral_port_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """The source ports the kernel gives outgoing connections (Linux's default when unreadable)."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def port_candidates(ephemeral: range) -> list[int]:
    """Ports from LOWEST_PORT up that neither the ephemeral nor the NodePort range holds."""
    taken = (ephemeral, NODE_PORT_RANGE)
    ports = [port for port in range(LOWEST_PORT, 65536) if not any(port in r for r in taken)]
    if len(ports) < 1000:
        raise OSError(
            f"net.ipv4.ip_local_port_range {ephemeral.start} {ephemeral.stop - 1} leaves only {len(ports)} "
            "ports for listeners; narrow it so that at least 1000 ports from 10000 up stay outside it"
        )
    return ports


def _reserve(port: int, directory: Path | None = None) -> bool:
    """Claim ``port`` for this caller unless another claimed it less than RESERVATION_S ago."""
    directory = directory or Path(tempfile.gettempdir()) / "metainfer-ports"
    directory.mkdir(exist_ok=True)
    claim = directory / str(port)
    # One lock over check-and-claim: two processes must not both find a claim stale and both renew it.
    with (directory / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if time.time() - claim.stat().st_mtime < RESERVATION_S:
                return False
        except FileNotFoundError:
            pass
        claim.touch()
        return True


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop_child(popen: subprocess.Popen[bytes] | None, grace_s: float = 15.0) -> None:
    """SIGTERM a child process and wait for it, SIGKILL it after ``grace_s``; one already gone is left alone."""
    if popen is None or popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(timeout=5)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def is_ours(pid: int, executable: str) -> bool:
    """True when ``pid`` is alive (not a zombie) and runs ``executable``."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return False
    exe = exe.removesuffix(" (deleted)")
    return state != "Z" and os.path.realpath(exe) == os.path.realpath(executable)


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


TERMINATE_GRACE_S = 10.0  # SIGTERM to SIGKILL; etcd and the API server flush on SIGTERM


def terminate(
    pid: int, executable: str, *, grace_s: float = TERMINATE_GRACE_S, popen: subprocess.Popen[bytes] | None = None
) -> bool:
    """SIGTERM the process group of ``pid``, SIGKILL after ``grace_s``; True if something was stopped."""
    if not is_ours(pid, executable):
        if popen is not None:
            popen.poll()
        return False
    try:
        group = os.getpgid(pid) == pid
    except ProcessLookupError:
        return False
    _signal(pid, group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            break
        if popen is None and not is_alive(pid):
            break
        time.sleep(0.05)
    else:
        _signal(pid, group, signal.SIGKILL)
        if popen is not None:
            popen.wait(timeout=5)
        else:
            _wait_gone(pid, 5.0)
    if group:  # stragglers in the group (none expected) must not outlive the leader
        _signal(pid, group, signal.SIGKILL)
    if popen is None:
        # Not our child: init reaps it. Wait a moment so `ps` right after `down` shows no zombie.
        deadline = time.monotonic() + 2.0
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return True


def _signal(pid: int, group: bool, sig: signal.Signals) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while is_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
