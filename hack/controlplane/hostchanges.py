"""What a node changes on the host, recorded before `up` and undone by `down`.

A kubelet, containerd, kube-proxy, kube-router's firewall and the CNI bridge
touch the host outside the cluster's root directory: sysctls, iptables chains
and ipsets, cgroups in every hierarchy, a bridge, mounts and a few fixed
directories. ``snapshot`` reads the state of
all of them before anything starts; ``undo`` puts back what differs after the
processes are gone; ``diff`` says what still differs (a test asserts it says
nothing after `down`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Written by the kubelet (the first three), by us and the bridge plugin (ip_forward), and left alone by
# kube-proxy with our config (conntrack sizes and timeouts 0, no localhost node ports) but watched anyway.
SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/netfilter/nf_conntrack_max",
    "net/bridge/bridge-nf-call-iptables",
)
# Paths the kubelet, containerd and libcni use whatever their configuration says.
FIXED_DIRS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/run/containerd",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    "/run/metainfer",  # the node's sockets (node.SOCKET_ROOT)
    "/var/lib/metainfer-kubelet",  # the kubelet's root directories (node.KUBELET_ROOT)
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAMES = ("kubepods", "k8s.io", "kubepods.slice")
CHAIN_PREFIXES = ("KUBE-", "CNI-", "METAINFER-")
IPTABLES = ("iptables", "ip6tables")
IPSET_PREFIXES = ("KUBE-", "kube-router")  # kube-router's sets (KUBE-SRC-*, KUBE-DST-*, kube-router-*)


@dataclass
class HostState:
    """The host as a node leaves it: compared field by field by ``diff``."""

    sysctls: dict[str, str] = field(default_factory=dict)
    existing_dirs: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    chains: dict[str, list[str]] = field(default_factory=dict)  # "iptables:nat" -> chain names of ours
    links: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)  # mount points under the watched roots
    # kube-router's sets, for NetworkPolicy peers; None in a state an older checkout wrote (nothing recorded, so
    # nothing is taken for ours).
    ipsets: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostState:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def snapshot(watched_roots: tuple[Path, ...] = ()) -> HostState:
    return HostState(
        sysctls={name: value for name in SYSCTLS if (value := _read_sysctl(name)) is not None},
        existing_dirs=[d for d in FIXED_DIRS if os.path.lexists(d)],
        cgroups=_our_cgroups(),
        chains=_our_chains(),
        links=_links(),
        mounts=_mounts((*watched_roots, *(Path(d) for d in FIXED_DIRS))),
        ipsets=_ipsets(),
    )


def diff(before: HostState, watched_roots: tuple[Path, ...] = ()) -> list[str]:
    """What differs now from ``before``, one line each; empty when the host is back as it was."""
    now = snapshot(watched_roots)
    problems = [
        f"sysctl {name} is {now.sysctls.get(name)!r}, was {value!r}"
        for name, value in before.sysctls.items()
        if now.sysctls.get(name) != value
    ]
    problems += [
        f"directory {d} was created and is still there" for d in now.existing_dirs if d not in before.existing_dirs
    ]
    problems += [f"cgroup {c} is left" for c in now.cgroups if c not in before.cgroups]
    for table, chains in now.chains.items():
        problems += [f"{table} chain {c} is left" for c in chains if c not in before.chains.get(table, [])]
    problems += [f"network link {link} is left" for link in now.links if link not in before.links]
    problems += [f"mount {m} is left" for m in now.mounts if m not in before.mounts]
    if before.ipsets is not None:
        problems += [f"ipset {s} is left" for s in now.ipsets or [] if s not in before.ipsets]
    return problems


def undo(before: HostState, watched_roots: tuple[Path, ...] = ()) -> list[str]:
    """Put the host back as ``before`` says; returns what could not be undone (also in ``diff``)."""
    for mount in sorted(_mounts((*watched_roots, *(Path(d) for d in FIXED_DIRS))), key=len, reverse=True):
        if mount not in before.mounts:
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    for table, chains in _our_chains().items():
        _remove_chains(table, [c for c in chains if c not in before.chains.get(table, [])])
    for name in _ipsets() if before.ipsets is not None else []:  # after the chains: a set in use cannot go
        if name not in before.ipsets:
            subprocess.run(["ipset", "destroy", name], capture_output=True, check=False)
    for link in _links():
        if link not in before.links and link.startswith(("metainfer", "veth", "cni")):
            subprocess.run(["ip", "link", "delete", link], capture_output=True, check=False)
    for cgroup in sorted(_our_cgroups(), key=lambda c: c.count("/"), reverse=True):
        if cgroup not in before.cgroups:
            _remove_cgroup(Path(cgroup))
    for name, value in before.sysctls.items():
        if _read_sysctl(name) != value:
            with contextlib.suppress(OSError):
                Path("/proc/sys", name).write_text(value + "\n")
    for directory in FIXED_DIRS:
        if directory not in before.existing_dirs and os.path.lexists(directory):
            shutil.rmtree(directory, ignore_errors=True)
    return diff(before, watched_roots)


def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _our_cgroups() -> list[str]:
    """Top-level cgroups a node makes in each hierarchy (the kubelet's kubepods, containerd's k8s.io)."""
    found = []
    if CGROUP_ROOT.is_dir():
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            for name in CGROUP_NAMES:
                if (hierarchy / name).is_dir():
                    found.append(str(hierarchy / name))
    return found


def _remove_cgroup(top: Path) -> None:
    """rmdir a cgroup tree bottom-up (cgroupfs only removes empty directories, and only with rmdir)."""
    for directory, _, _ in sorted(os.walk(top), key=lambda entry: entry[0].count("/"), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _our_chains() -> dict[str, list[str]]:
    chains: dict[str, list[str]] = {}
    for binary in IPTABLES:
        if shutil.which(binary) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            result = subprocess.run([binary, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False)
            names = [
                line.split()[1]
                for line in result.stdout.splitlines()
                if line.startswith("-N ") and line.split()[1].startswith(CHAIN_PREFIXES)
            ]
            chains[f"{binary}:{table}"] = sorted(names)
    return chains


def _remove_chains(table_key: str, chains: list[str]) -> None:
    """Delete the jumps into ``chains`` from every chain, then flush and delete them."""
    if not chains:
        return
    binary, table = table_key.split(":")
    base = [binary, "-w", "-t", table]
    rules = subprocess.run([*base, "-S"], capture_output=True, text=True, check=False).stdout.splitlines()
    for rule in rules:
        parts = shlex.split(rule)
        if parts[:1] == ["-A"] and any(target in chains for target in _targets(parts)):
            subprocess.run([*base, "-D", *parts[1:]], capture_output=True, check=False)
    for chain in chains:
        subprocess.run([*base, "-F", chain], capture_output=True, check=False)
    for chain in chains:
        subprocess.run([*base, "-X", chain], capture_output=True, check=False)


def _targets(parts: list[str]) -> list[str]:
    return [parts[i + 1] for i, part in enumerate(parts[:-1]) if part in ("-j", "-g", "--jump", "--goto")]


def _ipsets() -> list[str]:
    if shutil.which("ipset") is None:
        return []
    result = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False)
    return sorted(name for name in result.stdout.split() if name.startswith(IPSET_PREFIXES))


def _links() -> list[str]:
    return sorted(os.listdir("/sys/class/net")) if Path("/sys/class/net").is_dir() else []


def _mounts(roots: tuple[Path, ...]) -> list[str]:
    """Mount points at or under ``roots`` (mountinfo's fifth field, octal escapes decoded)."""
    prefixes = tuple(str(root.resolve()) if root.exists() else str(root) for root in roots)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            found.append(point)
    return found
