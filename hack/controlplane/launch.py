"""Run etcd + kube-apiserver (+ kube-controller-manager) on loopback in one directory.

The library that launches a control plane (``start``, ``stop``, ``load``, ``ControlPlane``): the command line
hack/cluster.py (`make cluster-up`), the integration and e2e fixtures and the benchmarks call it.

Everything a cluster owns lives under its root directory: certificates, etcd
data, logs, the kubeconfig and ``state.json`` with the pids. The state file is
written after every launch, so a crashed ``up`` can still be cleaned by ``down``;
a failing ``start`` stops what it started before raising.

kube-controller-manager runs only the garbage collector, namespace,
service-account and cluster-role aggregation controllers: owner-reference
cascades, namespace deletion and aggregated roles then behave like a real
cluster, while Jobs and Deployments stay untouched by controllers (no kubelet
runs here; tests drive them).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack.controlplane import crds, hostchanges, netpol, processes, s3proxy
from hack.controlplane import node as node_mod
from hack.controlplane import pki as pki_mod
from hack.controlplane import registry as registry_mod
from hack.controlplane.assets import Assets
from hack.controlplane.errors import ControlPlaneError, StartError

Log = Callable[[str], None]
STATE_FILE = "state.json"
OBJECT_STORE_PROCESS = "objectstore"  # its name in the state file: stop() gives it a shorter grace
OWNED = (STATE_FILE, f"{STATE_FILE}.tmp", "kubeconfig", "pki", "etcd-data", "logs", "node", "registry", "objectstore")
# clusterrole-aggregation: the chart folds its user roles into edit/admin/view, as a real cluster does.
CONTROLLERS = (
    "garbage-collector-controller,namespace-controller,serviceaccount-controller,clusterrole-aggregation-controller"
)


@dataclass
class ControlPlane:
    """A running control plane: where to reach it and what to stop."""

    root: Path
    server: str
    kubeconfig: Path
    ca_cert: Path
    client_cert: Path
    client_key: Path
    pids: dict[str, int]
    executables: dict[str, str]
    popens: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    audit_log: Path | None = None  # JSON lines, one per request stage, when started with audit=True

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def get(self, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
        """GET ``path`` on the API server as admin; returns (status, body)."""
        try:
            with urllib.request.urlopen(self.server + path, timeout=timeout_s, context=self.ssl_context()) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def stop(self) -> list[str]:
        return stop(self.root, popens=self.popens)

    @property
    def registry(self) -> registry_mod.ClusterRegistry | None:
        """The registry the node pulls from (started with the node), or None without a node."""
        return registry_mod.ClusterRegistry.load(self.root / "registry")

    @property
    def object_store(self) -> s3proxy.ClusterObjectStore | None:
        """The S3 store pods read models from (started with the node), or None without a node."""
        return s3proxy.ClusterObjectStore.load(self.root / "objectstore")


def start(
    root: Path,
    assets: Assets,
    *,
    log: Log = print,
    controller_manager: bool = True,
    timeout_s: float = 120.0,
    die_with_parent: bool = False,
    crd_documents: list[dict[str, Any]] | None = None,
    audit: bool = False,
    node: bool = False,
    node_labels: dict[str, str] | None = None,
) -> ControlPlane:
    """Start a fresh control plane under ``root`` (which must not hold a running one).

    ``node`` adds a real node (kube-scheduler, every kube-controller-manager controller,
    containerd, kubelet, kube-proxy; see ``node.py``): pods then run. Needs root.

    ``crd_documents`` are installed (and Established) before kube-controller-manager
    starts, so its garbage collector watches them from its first discovery instead
    of up to 30 s later. ``audit`` makes kube-apiserver log every request's metadata
    (user, user agent, verb, resource) to ``logs/audit.log``: the one count of API
    requests a client cannot get wrong about itself (the operator-scale benchmark).
    """
    if (root / STATE_FILE).exists():
        raise ControlPlaneError(f"{root / STATE_FILE} exists: a control plane may be running; stop it first")
    root.mkdir(parents=True, exist_ok=True)
    # What a failed start left; never anything else under root.
    for leftover in ("etcd-data", "pki", "logs", "node", "registry", "objectstore"):
        shutil.rmtree(root / leftover, ignore_errors=True)
    popens: dict[str, subprocess.Popen[bytes]] = {}
    state = _State(root)
    kube_router: Path | None = None
    if node:
        node_mod.require_host()
        kube_router = netpol.provide(log)  # a Go build on a cold cache: before anything starts or the host changes
        root.mkdir(parents=True, exist_ok=True)
        state.host = hostchanges.snapshot((root.resolve(),)).to_json()
        state.save()  # before touching the host: `down` undoes exactly what differs from this
    try:
        plane = _start(
            root, assets, log, controller_manager, timeout_s, die_with_parent, crd_documents, audit, popens, state, node
        )
        if kube_router is not None:
            _start_node(plane, assets, kube_router, log, die_with_parent, popens, state, node_labels or {}, timeout_s)
        return plane
    except BaseException:
        stop(root, popens=popens, remove=False)
        raise


def _start(
    root: Path,
    assets: Assets,
    log: Log,
    controller_manager: bool,
    timeout_s: float,
    die_with_parent: bool,
    crd_documents: list[dict[str, Any]] | None,
    audit: bool,
    popens: dict[str, subprocess.Popen[bytes]],
    state: _State,
    node: bool = False,
) -> ControlPlane:
    started = time.monotonic()
    deadline = started + timeout_s
    logs = root / "logs"
    certs = pki_mod.generate(
        root / "pki",
        extra_ips=(node_mod.NODE_IP,) if node else (),
        clients=NODE_IDENTITIES if node else None,
    )
    etcd_port, peer_port, api_port = processes.free_port(), processes.free_port(), processes.free_port()
    # With a node the API server listens on the pod bridge's address: pods reach it through the
    # `kubernetes` Service, the host through the same address (a local one).
    api_host = node_mod.NODE_IP if node else "127.0.0.1"
    if node:
        node_mod.setup_network()
    server = f"https://{api_host}:{api_port}"
    kubeconfig = root / "kubeconfig"
    write_kubeconfig(kubeconfig, server, certs)
    state.server, state.kubeconfig = server, str(kubeconfig)

    launch = _launcher(popens, state, logs, die_with_parent)

    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    launch(
        "etcd",
        assets.etcd,
        [
            "--name=default",
            f"--data-dir={root / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync=true",  # throwaway data: durability buys nothing, fsync costs seconds
            "--log-level=warn",
        ],
    )
    _wait(lambda: _http_ok(f"{etcd_url}/health"), "etcd", popens, logs, deadline)

    audit_log = logs / "audit.log" if audit else None
    audit_args = _audit_args(logs) if audit else []
    launch(
        "kube-apiserver",
        assets.kube_apiserver,
        [
            f"--etcd-servers={etcd_url}",
            f"--secure-port={api_port}",
            f"--bind-address={api_host}",
            f"--advertise-address={api_host}",
            *(_node_apiserver_args(certs) if node else ["--endpoint-reconciler-type=none"]),  # loopback cannot back it
            f"--cert-dir={root / 'pki'}",
            f"--tls-cert-file={certs.serving_cert}",
            f"--tls-private-key-file={certs.serving_key}",
            f"--client-ca-file={certs.ca_cert}",
            "--authorization-mode=" + ("Node,RBAC" if node else "RBAC"),
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={certs.sa_pub}",
            f"--service-account-signing-key-file={certs.sa_key}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            *audit_args,
        ],
    )
    plane = ControlPlane(
        root=root,
        server=server,
        kubeconfig=kubeconfig,
        ca_cert=certs.ca_cert,
        client_cert=certs.admin_cert,
        client_key=certs.admin_key,
        pids=state.pids,
        executables=state.executables,
        popens=popens,
        audit_log=audit_log,
    )
    _wait(lambda: _api_ok(plane, "/readyz"), "kube-apiserver", popens, logs, deadline)
    if crd_documents:
        from kubernetes import config

        with config.new_client_from_config(config_file=str(kubeconfig)) as api_client:
            names = crds.install(api_client, crd_documents)
        log(f"CRDs established: {', '.join(names)}")

    kcm = assets.kube_controller_manager if controller_manager or node else None
    if kcm is not None:
        launch(
            "kube-controller-manager",
            kcm,
            [
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--concurrent-gc-syncs=5",
                "--v=1",
                *(_node_kcm_args(root, server, certs) if node else [f"--controllers={CONTROLLERS}"]),
            ],
        )
    elif controller_manager:
        log("kube-controller-manager not available: owner-reference GC and namespace deletion will not run")
    log(f"control plane ready at {server} in {time.monotonic() - started:.1f}s")
    return plane


def _launcher(
    popens: dict[str, subprocess.Popen[bytes]], state: _State, logs: Path, die_with_parent: bool
) -> Callable[[str, Path, list[str]], None]:
    """Start a daemon and record it in the state file before waiting on it: a crash from then on is still
    cleaned up by `down`."""

    def launch(name: str, executable: Path, args: list[str]) -> None:
        popens[name] = processes.launch(name, [str(executable), *args], logs, die_with_parent=die_with_parent)
        state.pids[name] = popens[name].pid
        state.executables[name] = str(executable)
        state.save()

    return launch


NODE_IDENTITIES: pki_mod.NodeIdentities = {
    "kubelet": (f"system:node:{node_mod.NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", None),
    # kube-router reads pods, namespaces, NetworkPolicies and its node; no built-in role grants that, and it is a
    # development cluster's own host process (root on the node already), so it gets the admin group.
    "kube-router": ("system:kube-router", "system:masters"),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kube-controller-manager": ("system:kube-controller-manager", None),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
}


def _node_apiserver_args(certs: pki_mod.Pki) -> list[str]:
    cert, key = certs.clients["apiserver-kubelet-client"]
    return [
        "--endpoint-reconciler-type=lease",
        "--enable-admission-plugins=NodeRestriction",
        f"--kubelet-client-certificate={cert}",
        f"--kubelet-client-key={key}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


def _node_kcm_args(root: Path, server: str, certs: pki_mod.Pki) -> list[str]:
    kubeconfig = _component_kubeconfig(root, server, certs, "kube-controller-manager")
    return [
        f"--kubeconfig={kubeconfig}",  # the last --kubeconfig wins: its own identity, not admin
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={certs.sa_key}",
        f"--root-ca-file={certs.ca_cert}",
        f"--service-cluster-ip-range={node_mod.SERVICE_SUBNET}",
        "--node-monitor-grace-period=20s",
    ]


def _component_kubeconfig(root: Path, server: str, certs: pki_mod.Pki, component: str) -> Path:
    path = root / "node" / f"{component}.kubeconfig"
    path.parent.mkdir(parents=True, exist_ok=True)
    cert, key = certs.clients[component]
    write_kubeconfig(path, server, certs, name=component, client=(cert, key))
    return path


def _start_node(
    plane: ControlPlane,
    assets: Assets,
    kube_router: Path,
    log: Log,
    die_with_parent: bool,
    popens: dict[str, subprocess.Popen[bytes]],
    state: _State,
    labels: dict[str, str],
    timeout_s: float,
) -> None:
    """Scheduler, containerd (with the pause image), kubelet, kube-proxy and kube-router's NetworkPolicy firewall;
    returns once the node is Ready."""
    from hack.controlplane import pause

    started = time.monotonic()
    deadline = started + timeout_s
    root, logs = plane.root, plane.root / "logs"
    certs = pki_mod.Pki(
        ca_cert=plane.ca_cert,
        ca_key=root / "pki" / "ca.key",
        serving_cert=root / "pki" / "apiserver.crt",
        serving_key=root / "pki" / "apiserver.key",
        admin_cert=plane.client_cert,
        admin_key=plane.client_key,
        sa_key=root / "pki" / "sa.key",
        sa_pub=root / "pki" / "sa.pub",
        clients={name: (root / "pki" / f"{name}.crt", root / "pki" / f"{name}.key") for name in NODE_IDENTITIES},
    )
    paths = node_mod.NodePaths(root / "node")

    launch = _launcher(popens, state, logs, die_with_parent)

    scheduler_config = _component_kubeconfig(root, plane.server, certs, "kube-scheduler")
    launch(
        "kube-scheduler",
        assets.node_binary("kube-scheduler"),
        [f"--kubeconfig={scheduler_config}", "--leader-elect=false", "--secure-port=0", "--v=1"],
    )
    registry = _start_registry(root, certs, launch, popens, logs, deadline, log)
    _start_object_store(root, certs, launch, popens, logs, deadline, log)
    node_mod.write_containerd_config(paths, {registry.address: registry.ca})
    launch("containerd", Path(shutil.which("containerd") or "containerd"), node_mod.containerd_args(paths))
    _wait(lambda: node_mod.containerd_ready(paths), "containerd", popens, logs, deadline)
    node_mod.import_image(paths, pause.archive(log))

    node_mod.write_kubelet_config(paths, plane.ca_cert, processes.free_port(), processes.free_port())
    launch(
        "kubelet",
        assets.node_binary("kubelet"),
        node_mod.kubelet_args(paths, _component_kubeconfig(root, plane.server, certs, "kubelet"), labels),
    )
    node_mod.write_kube_proxy_config(
        paths,
        _component_kubeconfig(root, plane.server, certs, "kube-proxy"),
        processes.free_port(),
        processes.free_port(),
    )
    launch("kube-proxy", assets.node_binary("kube-proxy"), node_mod.kube_proxy_args(paths))
    _wait(lambda: _node_ready(plane), f"node {node_mod.NODE_NAME} Ready", popens, logs, deadline)
    # kube-router exits when its Node object does not exist yet: it starts once the node is Ready. `up` returns
    # only after its first sync, so a NetworkPolicy applied next is enforced, not silently ignored.
    launch(
        "kube-router",
        kube_router,
        netpol.args(
            _component_kubeconfig(root, plane.server, certs, "kube-router"), node_mod.NODE_NAME, node_mod.SERVICE_SUBNET
        ),
    )
    _wait(netpol.synced, "kube-router's first sync of the NetworkPolicy firewall", popens, logs, deadline)
    # Pods are refused until the service-account controller made `default` in their namespace.
    _wait(
        lambda: _api_ok(plane, "/api/v1/namespaces/default/serviceaccounts/default"),
        "the default ServiceAccount",
        popens,
        logs,
        deadline,
    )
    log(f"node {node_mod.NODE_NAME} Ready in {time.monotonic() - started:.1f}s")


def _start_registry(
    root: Path,
    certs: pki_mod.Pki,
    launch: Callable[[str, Path, list[str]], None],
    popens: dict[str, subprocess.Popen[bytes]],
    logs: Path,
    deadline: float,
    log: Log,
) -> registry_mod.ClusterRegistry:
    """CNCF Distribution on loopback for the node's containerd: TLS from the cluster's CA, one htpasswd account
    with a fresh random password. Loopback only: containerd runs on the host, and no pod needs the registry."""
    binary = registry_mod.provide(log)
    directory = root / "registry"
    cert, key = pki_mod.issue_serving(
        certs.ca_cert, certs.ca_key, directory / "tls", "metainfer-registry", ips=("127.0.0.1",), dns=("localhost",)
    )
    credentials = registry_mod.Credentials("metainfer", secrets.token_urlsafe(24))
    server = registry_mod.RegistryServer(binary, directory, cert, key, certs.ca_cert, credentials)
    launch("registry", binary, ["serve", str(server.write_config())])
    _wait(server.answers, "the registry", popens, logs, deadline)
    found = registry_mod.ClusterRegistry(server.address, certs.ca_cert, credentials)
    found.save(directory)
    log(f"registry at https://{found.address} (TLS from the cluster CA, htpasswd; {directory / 'registry.json'})")
    return found


def _start_object_store(
    root: Path,
    certs: pki_mod.Pki,
    launch: Callable[[str, Path, list[str]], None],
    popens: dict[str, subprocess.Popen[bytes]],
    logs: Path,
    deadline: float,
    log: Log,
) -> s3proxy.ClusterObjectStore:
    """S3Proxy on the node's bridge address, where pods reach it (policies' s3:// models), with TLS from the
    cluster's CA and one fresh access key; every bucket private."""
    runtime = s3proxy.provide(log)
    directory = root / "objectstore"
    cert, key = pki_mod.issue_serving(
        certs.ca_cert, certs.ca_key, directory / "tls", "metainfer-objectstore", ips=(node_mod.NODE_IP,)
    )
    server = s3proxy.ObjectStore(runtime, directory, tls=(cert, key), host=node_mod.NODE_IP)
    directory.mkdir(parents=True, exist_ok=True)
    java, *arguments = server.command()
    launch(OBJECT_STORE_PROCESS, Path(java), arguments)
    _wait(lambda: server.answers(certs.ca_cert), "the object store", popens, logs, deadline)
    found = s3proxy.ClusterObjectStore(server.endpoint, certs.ca_cert, server.credentials, server.buckets)
    found.save(directory)
    log(f"object store at {found.endpoint} (S3; TLS from the cluster CA; {directory / 'objectstore.json'})")
    return found


def _node_ready(plane: ControlPlane) -> bool:
    with contextlib.suppress(OSError, urllib.error.URLError, ssl.SSLError, ValueError):
        code, body = plane.get(f"/api/v1/nodes/{node_mod.NODE_NAME}", timeout_s=2)
        if code != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return False


def stop(root: Path, *, popens: dict[str, subprocess.Popen[bytes]] | None = None, remove: bool = True) -> list[str]:
    """Stop every process recorded under ``root`` (newest first); remove ``root`` if asked."""
    stopped: list[str] = []
    unstopped: list[str] = []
    state_path = root / STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.exists() else {"pids": {}, "executables": {}}
    popens = popens or {}
    names = list(dict.fromkeys([*state["pids"], *popens]))
    if state.get("host") is not None:
        # The kubelet first, so nothing restarts what is killed next; then every container and shim.
        for name in ("kube-router", "kube-proxy", "kubelet"):
            if name in names:
                names.remove(name)
                popen = popens.get(name)
                pid = popen.pid if popen is not None else int(state["pids"][name])
                if processes.terminate(pid, state["executables"].get(name, ""), popen=popen):
                    stopped.append(name)
        try:
            node_mod.stop_workloads(node_mod.NodePaths(root / "node"))
        except OSError as exc:  # the processes, mounts, links and chains below must still go
            unstopped.append(f"stopping the node's containers: {exc!r}")
    for name in reversed(names):
        popen = popens.get(name)
        pid = popen.pid if popen is not None else int(state["pids"][name])
        executable = state["executables"].get(name) or (str(popen.args[0]) if popen is not None else "")
        grace = s3proxy.SHUTDOWN_GRACE_S if name == OBJECT_STORE_PROCESS else processes.TERMINATE_GRACE_S
        if processes.terminate(pid, str(executable), grace_s=grace, popen=popen):
            stopped.append(name)
    if state.get("host") is not None:
        paths = node_mod.NodePaths(root / "node")
        watched = (root.resolve(), paths.kubelet_dir)
        hostchanges.undo(hostchanges.HostState.from_json(state["host"]), watched)  # unmounts first
        node_mod.remove_short_dirs(paths)
        left = hostchanges.diff(hostchanges.HostState.from_json(state["host"]), watched)
        if left or unstopped:
            raise ControlPlaneError("the node did not stop cleanly:\n  " + "\n  ".join([*unstopped, *left]))
    state_path.unlink(missing_ok=True)
    if remove:
        # Only what we create, then the directory if that emptied it: `--root ~` must not wipe a home.
        for entry in OWNED:
            path = root / entry
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            root.rmdir()
    return stopped


def load(root: Path) -> ControlPlane | None:
    """The control plane recorded under ``root`` if its API server process is still ours and alive."""
    state_path = root / STATE_FILE
    if not state_path.exists():
        return None
    state = json.loads(state_path.read_text())
    pid = state["pids"].get("kube-apiserver")
    if pid is None or not processes.is_ours(pid, state["executables"]["kube-apiserver"]):
        return None
    pki_dir = root / "pki"
    return ControlPlane(
        root=root,
        server=state["server"],
        kubeconfig=Path(state["kubeconfig"]),
        ca_cert=pki_dir / "ca.crt",
        client_cert=pki_dir / "admin.crt",
        client_key=pki_dir / "admin.key",
        pids=state["pids"],
        executables=state["executables"],
    )


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""


def _audit_args(logs: Path) -> list[str]:
    """kube-apiserver flags for a Metadata-level audit log under ``logs`` (no bodies: cheap, no secrets)."""
    policy = logs / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={logs / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-maxbackup=0",  # one file: a reader counts every request in it
        "--audit-log-maxsize=0",
    ]


def write_kubeconfig(
    path: Path,
    server: str,
    certs: pki_mod.Pki,
    name: str = "metainfer-dev",
    client: tuple[Path, Path] | None = None,
) -> None:
    """A self-contained kubeconfig (certificates embedded, so it can be copied anywhere); admin by default."""
    client_cert, client_key = client or (certs.admin_cert, certs.admin_key)

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(certs.ca_cert)}}],
        "users": [
            {
                "name": f"{name}-admin",
                "user": {
                    "client-certificate-data": b64(client_cert),
                    "client-key-data": b64(client_key),
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin", "namespace": "default"}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


@dataclass
class _State:
    """What ``down`` needs to find and stop the daemons, written atomically after each launch."""

    root: Path
    server: str = ""
    kubeconfig: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    executables: dict[str, str] = field(default_factory=dict)
    host: dict[str, Any] | None = None  # hostchanges.HostState before a node started, for `down`

    def save(self) -> None:
        data = {
            "server": self.server,
            "kubeconfig": self.kubeconfig,
            "pids": self.pids,
            "executables": self.executables,
            "host": self.host,
        }
        tmp = self.root / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.root / STATE_FILE)


def _wait(
    ready: Callable[[], bool],
    name: str,
    popens: dict[str, subprocess.Popen[bytes]],
    logs: Path,
    deadline: float,
) -> None:
    while True:
        for proc_name, popen in popens.items():
            if popen.poll() is not None:
                raise StartError(
                    f"{proc_name} exited with code {popen.returncode} while waiting for {name}; "
                    f"log: {logs / f'{proc_name}.log'}\n{_tail(logs / f'{proc_name}.log')}"
                )
        if ready():
            return
        if time.monotonic() > deadline:
            raise StartError(f"{name} not ready in time; log: {logs / f'{name}.log'}\n{_tail(logs / f'{name}.log')}")
        time.sleep(0.2)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _api_ok(plane: ControlPlane, path: str) -> bool:
    with contextlib.suppress(OSError, urllib.error.URLError, ssl.SSLError):
        return plane.get(path, timeout_s=2)[0] == 200
    return False


def _tail(path: Path, lines: int = 12) -> str:
    """The log's last error lines (klog ``E...`` lines, fatal/failed), else its last lines."""
    try:
        text = path.read_text(errors="replace").splitlines()[-300:]
    except FileNotFoundError:
        return "(no log)"
    errors = [
        line for line in text if re.match(r"^[EF]\d{4} ", line) or re.search(r"(?i)\b(fatal|failed|error)\b", line)
    ]
    return "\n".join((errors or text)[-lines:])
