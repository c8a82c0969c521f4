"""Debian packages the development tools install when missing (Prometheus, the node's containerd and runc,
mmdebstrap for the image), through one door.

Two of our processes may reach apt at once (`make test` runs the e2e tier, which installs the node's packages and
mmdebstrap, beside integration tests that may install Prometheus; `make -j` does the like), and apt-get refuses a
second caller outright ("Could not get lock /var/lib/dpkg/lock-frontend"). Installs are serialised with a lock of
our own and also wait for dpkg's lock (a package manager outside this project may hold it). On a fresh
machine the package lists may be empty: the lists are refreshed first, once per call, so an install does not
depend on which caller ran first.
"""

from __future__ import annotations

import os
import subprocess

from hack.controlplane.assets import cache_root, lock
from hack.controlplane.errors import ControlPlaneError

# How long apt-get waits for dpkg's lock that someone else holds, in seconds.
DPKG_LOCK_WAIT_S = 600
TIMEOUT_S = 900


class AptError(ControlPlaneError):
    """apt-get failed; the message holds its command and the tail of what it said."""


def install(packages: list[str]) -> None:
    """``apt-get install`` ``packages`` (root only), after refreshing the package lists."""
    if not packages:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    wait = ["-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}"]
    commands = (
        ["apt-get", *wait, "update", "-qq"],
        ["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends", *packages],
    )
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with lock(root / "apt.lock"):
        for command in commands:
            try:
                result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired as exc:
                raise AptError(f"{' '.join(command)} took over {TIMEOUT_S} s") from exc
            if result.returncode != 0:
                raise AptError(
                    f"{' '.join(command)} failed (exit {result.returncode}):\n{result.stderr.strip()[-1500:]}"
                )
