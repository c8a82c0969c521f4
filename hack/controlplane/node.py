"""A real node beside the control plane: containerd + runc, a CNI bridge, kubelet, kube-proxy.

Everything lives under ``<cluster root>/node`` except what the components
insist on putting elsewhere (see ``hostchanges``). Why each setting:

- containerd 1.6 and runc are Debian's packages (``apt-get install``): they are
  the versions the distribution patches, and the kubelet at the pinned
  Kubernetes version still talks CRI v1 to containerd 1.6 (it falls back to the
  kubelet's cgroup driver because 1.6 lacks the RuntimeConfig call).
  ``restrict_oom_score_adj``: root here lacks CAP_SYS_RESOURCE, and without it
  every sandbox fails. ``netns_mounts_under_state_dir`` keeps pod network
  namespaces under our root, so ``down`` finds them.
- The pod network is a bridge (``metainfer0``) with a host-local range; the
  bridge's own address is the node's InternalIP and where the API server
  listens, so pods reach the API through the ``kubernetes`` Service (kube-proxy
  DNATs to it) and nothing needs loopback inside a pod. No masquerading to the
  outside, and a FORWARD rule drops anything between the bridge and any other
  interface: pods talk only among themselves and to the node.
- The kubelet runs cgroupfs on cgroup v1 (no systemd here; ``failCgroupV1:
  false``), serves on the bridge address with webhook authn/authz, and its
  fixed paths that can move (pod logs, volume plugins) move under our root.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from hack.controlplane import apt
from hack.controlplane.errors import ControlPlaneError

NODE_NAME = "metainfer-node"
BRIDGE = "metainfer0"
POD_SUBNET = "10.244.0.0/24"
NODE_IP = "10.244.0.1"
SERVICE_SUBNET = "10.0.0.0/24"
PAUSE_IMAGE = "metainfer.local/pause:1"
# ipset: kube-router's NetworkPolicy firewall (netpol.py) matches a policy's peers with sets.
DEBIAN_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "ipset", "conntrack", "iproute2")
CNI_BIN_DIR = Path("/usr/lib/cni")
ISOLATION_CHAIN = "METAINFER-ISOLATION"
# The host's own packets to Service addresses that no cluster rule took: rejected here, never routed. (The pod
# range is the bridge's own connected subnet: its packets never reach the default route.)
UNROUTABLE_CHAIN = "METAINFER-UNROUTABLE"
SOCKET_ROOT = Path("/run/metainfer")
KUBELET_ROOT = Path("/var/lib/metainfer-kubelet")

Launch = Callable[[str, Path, list[str]], None]


@dataclass(frozen=True)
class NodePaths:
    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def short_id(self) -> str:
        return hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]

    @property
    def socket_dir(self) -> Path:
        """Unix sockets cannot live under a deep root (104-byte path limit): a short directory per cluster root."""
        return SOCKET_ROOT / self.short_id

    @property
    def containerd_socket(self) -> Path:
        return self.socket_dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_dir(self) -> Path:
        """Short for the same reason: the kubelet makes its plugin and pod-resources sockets in it."""
        return KUBELET_ROOT / self.short_id

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy-config.yaml"


def require_host() -> None:
    """Root, no other node running, the Debian packages a node needs (installed with apt-get when missing)."""
    if os.geteuid() != 0:
        raise ControlPlaneError("a node needs root (kubelet, containerd and the CNI bridge change the host)")
    running = running_node_kubelets()
    if running:
        raise ControlPlaneError(
            f"a metainfer node already runs on this machine (kubelet pid {', '.join(map(str, running))}): one node "
            "per machine (one bridge, one set of host paths); stop it first (`make cluster-down`)"
        )
    install_packages()
    for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ipset", "ip"):
        if shutil.which(tool) is None:
            raise ControlPlaneError(f"{tool} is not on PATH after installing {', '.join(DEBIAN_PACKAGES)}")
    if not (CNI_BIN_DIR / "bridge").exists():
        raise ControlPlaneError(f"{CNI_BIN_DIR}/bridge is missing (Debian's containernetworking-plugins)")


def running_node_kubelets() -> list[int]:
    """Pids of kubelets started as this project's node (their argv names the node)."""
    return _processes(b"kubelet", f"--hostname-override={NODE_NAME}".encode())


def _processes(program: bytes, argument: bytes) -> list[int]:
    """Pids whose argv[0] ends with ``program`` and whose argv holds ``argument`` (zombies have no argv)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(program) and argument in argv:
            found.append(int(proc.name))
    return found


def install_packages() -> list[str]:
    """Install the Debian packages a node needs that are missing (apt-get, root); returns those it installed."""
    missing = [pkg for pkg in DEBIAN_PACKAGES if not _deb_installed(pkg)]
    apt.install(missing)
    return missing


def _deb_installed(package: str) -> bool:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False)
    return result.returncode == 0 and result.stdout.strip().endswith("installed")


def setup_network() -> None:
    """The bridge with the node's address, forwarding on, and the isolation rules (undone by hostchanges)."""
    if not Path("/sys/class/net", BRIDGE).exists():
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    prefix = POD_SUBNET.split("/")[1]
    addresses = subprocess.run(["ip", "-o", "addr", "show", "dev", BRIDGE], capture_output=True, text=True).stdout
    if f" {NODE_IP}/" not in addresses:
        _run(["ip", "addr", "add", f"{NODE_IP}/{prefix}", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    # Isolation in mangle FORWARD, which every forwarded packet passes before filter FORWARD: there kube-proxy and
    # kube-router insert their jumps above ours, and kube-router ends its chain with an ACCEPT of every packet no
    # NetworkPolicy denies, which would let a pod's packet to a Service address nothing serves out of the host.
    mangle = ["iptables", "-w", "-t", "mangle"]
    if subprocess.run([*mangle, "-S", ISOLATION_CHAIN], capture_output=True).returncode != 0:
        _run([*mangle, "-N", ISOLATION_CHAIN])
        _run([*mangle, "-A", ISOLATION_CHAIN, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP"])
        _run([*mangle, "-A", ISOLATION_CHAIN, "-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP"])
        _run([*mangle, "-I", "FORWARD", "1", "-j", ISOLATION_CHAIN])
    base = ["iptables", "-w", "-t", "filter"]
    # A deleted Service's cluster IP is a trap: once kube-proxy has removed its rules, a request the host still
    # sends there would follow the default route off the machine. filter OUTPUT runs after kube-proxy's nat
    # OUTPUT, which has already rewritten live Services to pod addresses, so only addresses no Service answers
    # reach this rule: rejected at once, on the host. Pods' packets cannot leave anyway (ISOLATION_CHAIN).
    # Undone with the other METAINFER- chains by hostchanges.undo.
    if subprocess.run([*base, "-S", UNROUTABLE_CHAIN], capture_output=True).returncode != 0:
        _run([*base, "-N", UNROUTABLE_CHAIN])
        _run([*base, "-A", UNROUTABLE_CHAIN, "-d", SERVICE_SUBNET, "-j", "REJECT"])
        _run([*base, "-I", "OUTPUT", "1", "-j", UNROUTABLE_CHAIN])


def write_containerd_config(paths: NodePaths, registries: dict[str, Path] | None = None) -> None:
    """containerd's config for the node; ``registries`` (``host:port`` -> CA file) are trusted through
    hosts.toml files (containerd's per-registry config), nothing else: no insecure registry anywhere."""
    base = paths.root / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    hosts_dir = base / "certs.d"
    for address, ca in (registries or {}).items():
        (hosts_dir / address).mkdir(parents=True, exist_ok=True)
        (hosts_dir / address / "hosts.toml").write_text(
            f'server = "https://{address}"\n\n[host."https://{address}"]\n'
            f'  capabilities = ["pull", "resolve"]\n  ca = "{ca}"\n'
        )
    text = f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{paths.containerd_socket}"

[ttrpc]
  address = "{paths.containerd_socket}.ttrpc"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

[{cri}.registry]
  config_path = "{hosts_dir}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{paths.cni_conf_dir}"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  # a pulled layer is kept once, unpacked: the archived copy beside it would double every image on a disk
  # the node shares with the host
  discard_unpacked_layers = true

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{base / "runc"}"
"""
    paths.containerd_config.parent.mkdir(parents=True, exist_ok=True)
    paths.socket_dir.mkdir(parents=True, exist_ok=True)
    paths.containerd_config.write_text(text)
    paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    conflist = {
        "cniVersion": "0.4.0",
        "name": "metainfer",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                    # No default route: a pod reaches its subnet and, through the node, Services; nothing else.
                    "routes": [{"dst": SERVICE_SUBNET, "gw": NODE_IP}],
                    "dataDir": str(paths.root / "cni" / "ipam"),
                },
            }
        ],
    }
    (paths.cni_conf_dir / "10-metainfer.conflist").write_text(json.dumps(conflist, indent=2))


def write_kubelet_config(paths: NodePaths, ca_cert: Path, port: int, healthz_port: int) -> None:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "podLogsDir": str(paths.root / "pod-logs"),
        "volumePluginDir": str(paths.root / "volume-plugins"),
        "resolvConf": "",
        "maxPods": 40,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Absolute disk floors, not percentages: the node's filesystem is the host's, shared with other work, and
        # 1% of a large disk is gigabytes. A CI run evicted the operator at 2 GiB free (1% of 252 GiB) and the
        # image reclaim that follows disk pressure deleted the sandbox image, which no registry serves.
        "evictionHard": {
            "memory.available": "200Mi",
            "nodefs.available": "256Mi",
            "imagefs.available": "256Mi",
            "nodefs.inodesFree": "1%",
        },
        "protectKernelDefaults": False,
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
    }
    paths.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))


def write_kube_proxy_config(paths: NodePaths, kubeconfig: Path, healthz_port: int, metrics_port: int) -> None:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "mode": "iptables",
        "clusterCIDR": POD_SUBNET,
        # Pod -> Service -> pod on one bridge: without br_netfilter's help the reply would skip the DNAT's
        # conntrack entry, so every Service connection is masqueraded to the node's address.
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        # 0: leave the host's conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": [f"{NODE_IP}/32"],
    }
    paths.kube_proxy_config.write_text(yaml.safe_dump(config, sort_keys=False))


def containerd_args(paths: NodePaths) -> list[str]:
    return ["--config", str(paths.containerd_config), "--log-level", "warn"]


def kubelet_args(paths: NodePaths, kubeconfig: Path, labels: dict[str, str]) -> list[str]:
    args = [
        f"--config={paths.kubelet_config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={paths.kubelet_dir}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    ]
    if labels:
        args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return args


def kube_proxy_args(paths: NodePaths) -> list[str]:
    return [f"--config={paths.kube_proxy_config}", "--v=1"]


def ctr(paths: NodePaths, *args: str, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(paths.containerd_socket), "-n", "k8s.io", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def import_image(paths: NodePaths, archive: Path) -> None:
    """Load an OCI archive into the node's containerd (the CRI namespace), without a registry."""
    result = ctr(paths, "images", "import", str(archive))  # unpacked now, not at the first pod start
    if result.returncode != 0:
        raise ControlPlaneError(f"ctr images import {archive} failed: {result.stderr.strip()[-1000:]}")


def containerd_ready(paths: NodePaths) -> bool:
    return paths.containerd_socket.exists() and ctr(paths, "version", timeout_s=5).returncode == 0


def stop_workloads(paths: NodePaths, grace_s: float = 10.0) -> None:
    """Kill every container process and shim of this node (after the kubelet is gone, so nothing restarts)."""
    for top in _pod_cgroups():
        _kill_cgroup_tree(top)
    socket = str(paths.containerd_socket)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        shims = _shims(socket)
        if not shims:
            return
        for pid in shims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        time.sleep(0.2)


def remove_short_dirs(paths: NodePaths) -> None:
    """The socket and kubelet directories outside the cluster root (after their mounts are gone)."""
    for directory, parent in ((paths.socket_dir, SOCKET_ROOT), (paths.kubelet_dir, KUBELET_ROOT)):
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            parent.rmdir()  # only when no other cluster root uses it


def _pod_cgroups() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    return [h / name for h in root.iterdir() if h.is_dir() for name in ("kubepods", "k8s.io") if (h / name).is_dir()]


def _kill_cgroup_tree(top: Path) -> None:
    for directory, _, files in os.walk(top):
        if "cgroup.procs" in files:
            for pid in _cgroup_pids(Path(directory, "cgroup.procs")):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)


def _cgroup_pids(procs: Path) -> list[int]:
    """The processes in a cgroup; none when the cgroup went away meanwhile. A pod's cgroup that containerd or the
    kubelet removes between the walk listing it and the read answers ENODEV on read() (ENOENT on open)."""
    try:
        text = procs.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return []
        raise
    return [int(field) for field in text.split() if field.isdigit()]


def _shims(socket: str) -> list[int]:
    """containerd-shim-runc-v2 processes started by our containerd (their argv names its socket)."""
    return _processes(b"containerd-shim-runc-v2", socket.encode())


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ControlPlaneError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")
