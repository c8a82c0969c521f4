"""NetworkPolicy enforcement on the development node: kube-router's firewall, and nothing else of it.

The node's CNI (Debian's bridge plugin) connects pods but enforces no NetworkPolicy, so the chart's policies
were accepted by the API server and never tried. kube-router (github.com/cloudnativelabs/kube-router, Apache-2.0)
enforces them with iptables and ipsets, which this kernel has (the nfqueue-based enforcers need
CONFIG_NFT_QUEUE, which it lacks). It runs as one more node process with ``--run-firewall`` alone: no routing,
no service proxy (kube-proxy keeps that), no CNI config. Pods no policy selects keep all traffic; traffic from
the node itself (the kubelet's probes, the host's Prometheus and clients) is always allowed, as kube-router does
on every cluster. Its chains are ``KUBE-``-prefixed and its sets are recorded by ``hostchanges``, so `down`
removes both.

    .venv/bin/python -m hack.controlplane.netpol   # build (or find) the binary and print its path
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hack.controlplane import assets

KUBE_ROUTER_VERSION = "v2.1.0"
KUBE_ROUTER = assets.GoBinary(
    name="kube-router",
    module="github.com/cloudnativelabs/kube-router/v2",
    version=KUBE_ROUTER_VERSION,
    package="github.com/cloudnativelabs/kube-router/v2/cmd/kube-router",
    ldflags=f"-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version={KUBE_ROUTER_VERSION}",
)


def provide(log: assets.Log = print) -> Path:
    """The kube-router binary: ``METAINFER_KUBE_ROUTER_BIN``, the cache, or a fresh Go build into the cache."""
    return assets.provide_go_binary(KUBE_ROUTER, "METAINFER_KUBE_ROUTER_BIN", log)


def synced() -> bool:
    """Whether kube-router has written its chains (its first sync: the jump every forwarded packet takes)."""
    result = subprocess.run(["iptables", "-w", "-S", "KUBE-ROUTER-FORWARD"], capture_output=True, check=False)
    return result.returncode == 0


def args(kubeconfig: Path, node_name: str, service_subnet: str) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        "--enable-ipv6=false",
        f"--service-cluster-ip-range={service_subnet}",
        "--health-port=0",  # no listener on the host
        "--metrics-port=0",
        "--v=1",
    ]


if __name__ == "__main__":
    print(provide(lambda message: print(message, file=sys.stderr)))
