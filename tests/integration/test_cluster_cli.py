"""`hack/cluster.py up`/`down` (what `make cluster-up`/`cluster-down` run) leave nothing behind.

These start their own control plane in a temporary root, separate from the
session's, and look for survivors in /proc by that root's path, which every
daemon has on its command line (data dir, certificates, kubeconfig).

Control plane only (`--no-node`): one node runs per machine and the e2e tier,
which runs beside this one, holds it; `up` with a node is tested there
(tests/e2e/test_node_lifecycle.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cluster_cli import CLUSTER_CLI, cluster_cli


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
            continue
        if text in cmdline and state != "Z" and str(CLUSTER_CLI) not in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def test_up_then_down_leaves_no_process_and_no_files(control_plane: object, tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    up = cluster_cli(root, "up", "--no-node")
    try:
        assert up.returncode == 0, up.stderr
        assert f"kubeconfig: {root / 'kubeconfig'}" in up.stdout
        assert "export KUBECONFIG=" in up.stdout
        assert "CRDs established:" in up.stderr and "adaptationpolicies.metainfer.io" in up.stderr
        pids = json.loads((root / "state.json").read_text())["pids"]
        assert {"etcd", "kube-apiserver"} <= pids.keys()
        assert not {"kubelet", "containerd"} & pids.keys()
        assert cluster_cli(root, "status").returncode == 0
        again = cluster_cli(root, "up")  # idempotent: reports the running one
        assert again.returncode == 0 and "already running" in again.stderr
    finally:
        down = cluster_cli(root, "down")
    assert down.returncode == 0, down.stderr
    assert _processes_mentioning(str(root)) == []
    assert not root.exists()
    assert cluster_cli(root, "status").returncode == 1


def test_failed_up_cleans_up_after_itself(control_plane: object, tmp_path: Path) -> None:
    """etcd starts, kube-apiserver dies at once: up fails naming the log, and etcd is stopped."""
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "etcd").symlink_to(control_plane.plane.executables["etcd"])  # type: ignore[attr-defined]
    broken = assets / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'simulated crash' >&2\nexit 3\n")
    broken.chmod(0o755)
    root = tmp_path / "cluster"
    up = cluster_cli(root, "up", "--no-controller-manager", "--no-node", env={"KUBEBUILDER_ASSETS": str(assets)})
    assert up.returncode == 1
    assert "kube-apiserver exited with code 3" in up.stderr
    assert str(root / "logs" / "kube-apiserver.log") in up.stderr
    assert _processes_mentioning(str(root)) == []
    assert not (root / "state.json").exists()


def test_down_without_a_cluster_is_harmless(tmp_path: Path) -> None:
    down = cluster_cli(tmp_path / "nothing", "down")
    assert down.returncode == 0
    assert "nothing" in down.stderr
