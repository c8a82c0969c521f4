"""`cluster up` with a node runs pods on a pod network; `cluster down` leaves the host exactly as it found it.

Runs before test_platform_e2e.py (file order): only one node can run on a machine.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from cluster_cli import cluster_cli
from platform_harness import require_root

from hack.controlplane import assets, hostchanges, launch
from hack.controlplane import node as node_mod
from hack.controlplane.errors import ControlPlaneError

PAUSE_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "hello", "namespace": "default"},
    "spec": {
        "containers": [{"name": "c", "image": node_mod.PAUSE_IMAGE, "imagePullPolicy": "Never"}],
        "terminationGracePeriodSeconds": 1,
    },
}


def _our_processes(executables: list[str], root: Path) -> list[str]:
    """Processes of this test's cluster still alive: its binaries run with paths under ``root`` (the integration
    tier may run its own control plane from the same binaries meanwhile), and the node's container shims."""
    found = []
    wanted = {os.path.realpath(e) for e in executables}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            exe = os.path.realpath(os.readlink(proc / "exe"))
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if (exe in wanted and str(root) in cmdline) or exe.endswith("containerd-shim-runc-v2"):
            found.append(f"{proc.name} {exe}")
    return found


def _a_service_address_nothing_serves_is_refused_on_the_host() -> None:
    """What a client following a deleted Service gets: refused at once here, never routed off the machine."""
    rules = subprocess.run(["iptables", "-w", "-S", "OUTPUT"], capture_output=True, text=True, check=True).stdout
    # Checked before any packet is sent: without the rule this address would follow the default route.
    assert f"-A OUTPUT -j {node_mod.UNROUTABLE_CHAIN}" in rules, rules
    chain = subprocess.run(["iptables", "-w", "-S", node_mod.UNROUTABLE_CHAIN], capture_output=True, text=True).stdout
    assert f"-d {node_mod.SERVICE_SUBNET} -j REJECT" in chain, chain
    unused = str(ipaddress.ip_network(node_mod.SERVICE_SUBNET)[-2])  # only the API server's Service exists here
    started = time.monotonic()
    with pytest.raises((ConnectionRefusedError, PermissionError)), socket.create_connection((unused, 8080), timeout=5):
        pass
    assert time.monotonic() - started < 2, "refused by the host's rule, not after a timeout"


def _pods_packets_off_the_bridge_are_dropped_before_any_accept() -> None:
    """A pod's packet to a Service address nothing serves must not leave the host either. kube-proxy and kube-router
    put their jumps first in filter FORWARD, and kube-router's chain ends in an ACCEPT of every packet no
    NetworkPolicy denies (a pod's too): the isolation is the first rule of mangle FORWARD, which runs before them."""
    mangle = ["iptables", "-w", "-t", "mangle", "-S"]
    forward = subprocess.run([*mangle, "FORWARD"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert forward[1:2] == [f"-A FORWARD -j {node_mod.ISOLATION_CHAIN}"], forward
    chain = subprocess.run([*mangle, node_mod.ISOLATION_CHAIN], capture_output=True, text=True, check=True).stdout
    assert f"-i {node_mod.BRIDGE} ! -o {node_mod.BRIDGE} -j DROP" in chain, chain
    assert f"! -i {node_mod.BRIDGE} -o {node_mod.BRIDGE} -j DROP" in chain, chain
    kube_router = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True).stdout
    assert "-j KUBE-ROUTER-FORWARD" in kube_router, "kube-router's firewall runs: the order above is what it meets"


def test_a_node_runs_a_pod_and_cluster_down_undoes_every_host_change(tmp_path: Path) -> None:
    """Through the CLI, as `make cluster-up` runs it as root: a node by default."""
    require_root()
    root = tmp_path / "cluster"
    root.mkdir()
    before = hostchanges.snapshot((root.resolve(),))
    kubectl = assets.find_kubectl()
    up = cluster_cli(root, "up")
    executables: list[str] = []
    try:
        assert up.returncode == 0, up.stderr
        assert f"kubeconfig: {root / 'kubeconfig'}" in up.stdout
        plane = launch.load(root)
        assert plane is not None, up.stderr
        executables = list(plane.executables.values())
        assert {"etcd", "kube-apiserver", "kubelet", "containerd", "kube-proxy", "kube-scheduler"} <= plane.pids.keys()
        assert cluster_cli(root, "status").returncode == 0
        again = cluster_cli(root, "up")  # idempotent: reports the running one
        assert again.returncode == 0 and "already running" in again.stderr
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}

        def kubectl_json(*args: str) -> dict[str, object]:
            out = subprocess.run(
                [str(kubectl), *args, "-o", "json"], env=env, capture_output=True, text=True, check=True
            )
            return dict(json.loads(out.stdout))

        subprocess.run(
            [str(kubectl), "apply", "-f", "-"],
            input=json.dumps(PAUSE_POD),
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        deadline = time.monotonic() + 120
        while True:
            pod = kubectl_json("get", "pod", "hello")
            status = pod.get("status", {})
            assert isinstance(status, dict)
            if status.get("phase") == "Running" and status.get("podIP"):
                break
            assert time.monotonic() < deadline, f"pod not Running with an IP: {status}"
            time.sleep(1)
        assert str(status["podIP"]).startswith(node_mod.POD_SUBNET.rsplit(".", 2)[0])
        assert hostchanges.diff(before, (root.resolve(),)), "a running node should show as host changes"
        _a_service_address_nothing_serves_is_refused_on_the_host()
        _pods_packets_off_the_bridge_are_dropped_before_any_accept()
        with pytest.raises(ControlPlaneError, match="already runs"):  # one node per machine
            node_mod.require_host()
    finally:
        down = cluster_cli(root, "down")
    assert down.returncode == 0, down.stderr
    left = hostchanges.diff(before, (root.resolve(),))
    assert left == [], left
    assert _our_processes(executables, root.resolve()) == []
    assert not root.exists()
    assert cluster_cli(root, "status").returncode == 1


def test_control_plane_only_mode_still_needs_no_root_nor_node_binaries(tmp_path: Path) -> None:
    """KUBEBUILDER_ASSETS users: etcd + kube-apiserver, nothing of the node, nothing on the host."""
    found = assets.provide(with_controller_manager=False)
    before = hostchanges.snapshot()
    plane = launch.start(tmp_path / "plane", found, die_with_parent=True, controller_manager=False)
    try:
        assert plane.server.startswith("https://127.0.0.1:")
        assert "kubelet" not in plane.pids and "containerd" not in plane.pids
    finally:
        plane.stop()
    if os.geteuid() == 0:
        assert hostchanges.diff(before) == []
    else:
        pytest.skip("host state is only fully readable as root")
