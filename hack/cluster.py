#!/usr/bin/env python3
"""Development control plane: `up`, `down`, `status`, `assets`.

    PYTHONSAFEPATH=1 .venv/bin/python hack/cluster.py up      # etcd + kube-apiserver + CRDs
    export KUBECONFIG=$PWD/.cluster/kubeconfig
    PYTHONSAFEPATH=1 .venv/bin/python hack/cluster.py down    # stops everything, removes .cluster/

Run it with the project's virtualenv Python (`make venv`): it imports the
development package `hack` installed there, needs `kubernetes`, `pyyaml` and
`cryptography`, and installs the pinned kubectl next to that Python.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The command line only: starting, stopping and finding a control plane is hack/controlplane/launch.py's.
from hack.controlplane import assets as assets_mod
from hack.controlplane import crds, launch, netpol
from hack.controlplane.errors import ControlPlaneError
from hack.controlplane.versions import ETCD_VERSION, KUBERNETES_VERSION

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO / ".cluster"


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


def cmd_assets(args: argparse.Namespace) -> int:
    started = time.monotonic()
    found = assets_mod.provide(log, with_controller_manager=not args.no_controller_manager, with_node=args.node)
    kubectl = assets_mod.find_kubectl(log)
    print(f"kube-apiserver {KUBERNETES_VERSION}: {found.kube_apiserver}")
    for name in assets_mod.NODE if args.node else ():
        print(f"{name}: {found.node_binary(name)}")
    if args.node:
        print(f"kube-router {netpol.KUBE_ROUTER_VERSION} (NetworkPolicy firewall): {netpol.provide(log)}")
    print(f"etcd {ETCD_VERSION}: {found.etcd}")
    print(f"kube-controller-manager: {found.kube_controller_manager or 'not available'}")
    print(f"kubectl: {kubectl}")
    print(f"source: {found.source} ({time.monotonic() - started:.0f}s)")
    print(f"export KUBEBUILDER_ASSETS={found.directory}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    root: Path = args.root
    running = launch.load(root)
    if running is not None:
        log(f"already running at {running.server}")
        _print_usage(running.kubeconfig)
        return 0
    if (root / launch.STATE_FILE).exists():
        log(f"cleaning up a dead control plane in {root}")
        launch.stop(root)
    started = time.monotonic()
    found = assets_mod.provide(log, with_controller_manager=not args.no_controller_manager, with_node=args.node)
    assets_mod.find_kubectl(log)
    documents = [] if args.no_crds else crds.load_crds(args.crds.glob("*.yaml"))
    if not args.no_crds and not documents:
        raise ControlPlaneError(f"no CustomResourceDefinitions found in {args.crds}; run `make crds` or pass --no-crds")
    plane = launch.start(
        root,
        found,
        log=log,
        controller_manager=not args.no_controller_manager,
        crd_documents=documents,
        node=args.node,
        timeout_s=300.0 if args.node else 120.0,
    )
    log(f"up in {time.monotonic() - started:.1f}s (assets: {found.source})")
    _print_usage(plane.kubeconfig)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = launch.stop(args.root)
    log(f"stopped {', '.join(stopped) if stopped else 'nothing (no running control plane)'}; cleaned {args.root}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    plane = launch.load(args.root)
    if plane is None:
        print("not running")
        return 1
    code, body = plane.get("/readyz")
    print(f"{plane.server} readyz={code} {body.strip()[:40]} pids={plane.pids}")
    print(f"kubeconfig: {plane.kubeconfig}")
    return 0 if code == 200 else 1


def _print_usage(kubeconfig: Path) -> None:
    kubectl = assets_mod.find_kubectl(log, install=False)
    print(f"kubeconfig: {kubeconfig}")
    print("use it with:")
    print(f"  export KUBECONFIG={kubeconfig}")
    print(f"  export PATH={kubectl.parent}:$PATH   # kubectl {KUBERNETES_VERSION.rsplit('.', 1)[0]}.x")
    print("  kubectl apply -f examples/ && kubectl get adaptationpolicies")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="cluster state directory")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("assets", "up"):
        p = sub.add_parser(name)
        p.add_argument("--no-controller-manager", action="store_true", help="only etcd + kube-apiserver")
    sub.choices["up"].add_argument("--crds", type=Path, default=REPO / "crds", help="CRD directory to install")
    sub.choices["up"].add_argument("--no-crds", action="store_true")
    sub.choices["assets"].add_argument(
        "--node", action=argparse.BooleanOptionalAction, default=True, help="also the node's binaries"
    )
    sub.choices["up"].add_argument(
        "--node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run a real node (kube-scheduler, containerd, kubelet, kube-proxy; needs root); "
        "--no-node: the control plane only, as KUBEBUILDER_ASSETS users have it",
    )
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    handler = {"assets": cmd_assets, "up": cmd_up, "down": cmd_down, "status": cmd_status}[args.command]
    try:
        return handler(args)
    except ControlPlaneError as exc:
        log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
