"""Tearing a node down: it reads each pod cgroup's processes while containerd and the kubelet remove those cgroups,
and one step's failure must not leave the host changes of the steps after it."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from hack.controlplane import hostchanges, launch, node
from hack.controlplane.errors import ControlPlaneError


def test_the_processes_of_a_cgroup_are_read_from_its_procs_file(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("12\n345\n")
    assert node._cgroup_pids(procs) == [12, 345]


def test_a_cgroup_removed_before_its_procs_file_is_opened_holds_no_process(tmp_path: Path) -> None:
    assert node._cgroup_pids(tmp_path / "gone" / "cgroup.procs") == []


def test_a_cgroup_removed_between_open_and_read_holds_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What CI met: a dead cgroup's cgroup.procs opens, then read() answers ENODEV ("No such device").
    procs = tmp_path / "cgroup.procs"
    procs.write_text("12\n")

    def dead(self: Path, *args: object, **kwargs: object) -> str:
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(Path, "read_text", dead)
    assert node._cgroup_pids(procs) == []


def test_any_other_read_error_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(self: Path, *args: object, **kwargs: object) -> str:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(PermissionError):
        node._cgroup_pids(tmp_path / "cgroup.procs")


def test_killing_a_tree_skips_a_cgroup_that_went_away_and_kills_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pod-a").mkdir()
    (tmp_path / "pod-a" / "cgroup.procs").write_text("101\n")
    (tmp_path / "pod-b").mkdir()
    (tmp_path / "pod-b" / "cgroup.procs").write_text("202\n")
    real_read = Path.read_text

    def read(self: Path, *args: object, **kwargs: object) -> str:
        if self.parent.name == "pod-a":
            raise OSError(errno.ENODEV, "No such device")
        return real_read(self)

    killed: list[int] = []
    monkeypatch.setattr(Path, "read_text", read)
    monkeypatch.setattr(node.os, "kill", lambda pid, sig: killed.append(pid))
    node._kill_cgroup_tree(tmp_path)
    assert killed == [202]


def test_the_kernel_answers_enodev_for_a_removed_cgroups_procs_file() -> None:
    """The assumption above, on this host's cgroup filesystem (v1's memory hierarchy or v2's root)."""
    root = Path("/sys/fs/cgroup/memory") if Path("/sys/fs/cgroup/memory").is_dir() else Path("/sys/fs/cgroup")
    if not os.access(root, os.W_OK):
        pytest.skip(f"{root} is not writable here (needs root)")
    probe = root / f"metainfer-unit-{os.getpid()}"
    probe.mkdir()
    try:
        handle = (probe / "cgroup.procs").open()
    finally:
        probe.rmdir()
    with handle, pytest.raises(OSError) as raised:
        handle.read()
    assert raised.value.errno == errno.ENODEV


def test_a_failure_to_stop_the_containers_still_undoes_the_host_and_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI once lost a node's bridge, chains and mounts to one error in stop_workloads: nothing after it ran."""
    (tmp_path / launch.STATE_FILE).write_text(
        json.dumps({"pids": {}, "executables": {}, "host": hostchanges.HostState().to_json()})
    )
    undone: list[hostchanges.HostState] = []

    def fails(paths: node.NodePaths, grace_s: float = 10.0) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(node, "stop_workloads", fails)
    monkeypatch.setattr(hostchanges, "undo", lambda before, watched=(): undone.append(before) or [])
    monkeypatch.setattr(hostchanges, "diff", lambda before, watched=(): [])
    monkeypatch.setattr(node, "remove_short_dirs", lambda paths: None)
    with pytest.raises(ControlPlaneError, match=r"stopping the node's containers: OSError.*Input/output error"):
        launch.stop(tmp_path)
    assert undone == [hostchanges.HostState()]


def test_the_ipsets_recorded_are_kube_routers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = subprocess.CompletedProcess(["ipset"], 0, stdout="KUBE-DST-AB12\nsomeone-elses\nkube-router-x\n")
    monkeypatch.setattr(hostchanges.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(hostchanges.subprocess, "run", lambda *args, **kwargs: listed)
    assert hostchanges._ipsets() == ["KUBE-DST-AB12", "kube-router-x"]


def test_a_state_another_checkout_wrote_still_reads() -> None:
    """An older one recorded no ipsets (so none is taken for ours); a newer one's unknown fields are skipped."""
    assert hostchanges.HostState.from_json({"sysctls": {}, "chains": {}}).ipsets is None
    assert hostchanges.HostState.from_json({"links": ["lo"], "recorded_later": 1}).links == ["lo"]


def _undo_with(monkeypatch: pytest.MonkeyPatch, before: hostchanges.HostState, sets: list[str]) -> list[list[str]]:
    """undo() over a host with one KUBE-ROUTER-FORWARD chain of ours and ``sets``; the commands it ran."""
    chains = ["KUBE-ROUTER-FORWARD"]
    calls: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        if command[:2] == ["ipset", "destroy"]:
            sets.remove(command[2])
        if "-X" in command:
            chains.remove(command[-1])
        return subprocess.CompletedProcess(command, 0, stdout="")

    for name, value in {"_mounts": [], "_links": [], "_our_cgroups": []}.items():
        monkeypatch.setattr(hostchanges, name, lambda *args, value=value: value)
    monkeypatch.setattr(hostchanges, "_our_chains", lambda: {"iptables:filter": list(chains)})
    monkeypatch.setattr(hostchanges, "_ipsets", lambda: sorted(sets))
    monkeypatch.setattr(hostchanges, "_read_sysctl", lambda name: None)
    monkeypatch.setattr(hostchanges.subprocess, "run", run)
    monkeypatch.setattr(hostchanges, "FIXED_DIRS", ())
    assert hostchanges.undo(before) == []
    return calls


def test_undo_destroys_the_ipsets_the_node_made_after_its_chains_and_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """A set a rule still uses cannot be destroyed: kube-router's chains go first; a set there before stays."""
    sets = ["KUBE-DST-NEW", "KUBE-SRC-OLD"]
    calls = _undo_with(monkeypatch, hostchanges.HostState(chains={}, ipsets=["KUBE-SRC-OLD"]), sets)
    destroyed = [c for c in calls if c[:2] == ["ipset", "destroy"]]
    assert destroyed == [["ipset", "destroy", "KUBE-DST-NEW"]] and sets == ["KUBE-SRC-OLD"]
    chain_gone = next(i for i, c in enumerate(calls) if "-X" in c)
    assert chain_gone < calls.index(destroyed[0]), calls


def test_undo_of_a_state_without_ipsets_destroys_none(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = ["KUBE-DST-SOMEONES"]
    calls = _undo_with(monkeypatch, hostchanges.HostState(chains={}), sets)
    assert not [c for c in calls if c[:1] == ["ipset"]] and sets == ["KUBE-DST-SOMEONES"]
