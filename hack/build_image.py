#!/usr/bin/env python3
"""`make image`: build metainfer.local/metainfer:<version> with no container engine, push it and the chart.

    PYTHONSAFEPATH=1 .venv/bin/python hack/build_image.py [--build-arg NAME=VALUE ...] [--no-push] [--import]

Follows the Dockerfile's runtime stage (see hack/image/build.py) and writes
build/image/metainfer-<version>.oci.tar. When `make cluster-up` runs a node, the image goes to the
cluster's registry (TLS from the cluster CA, htpasswd) as <registry>/metainfer:<tag>, the chart is packaged
and pushed beside it as an OCI artifact, and the `helm install oci://...` line that installs both, the image
by digest with a pull secret, is printed. `--import` loads the archive into the node's containerd with `ctr`
instead: a fallback for a node without the registry, not the way a cluster gets images. Users with their own
registry build the same image with `docker build` (docs/real-cluster.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hack import helm
from hack.controlplane import launch
from hack.controlplane import registry as registry_mod
from hack.controlplane.errors import ControlPlaneError
from hack.image import build

REPO = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--no-push", action="store_true", help="build only: push nothing to the cluster's registry")
    fallback = "fallback: load the archive into the node's containerd with ctr (no registry)"
    parser.add_argument("--import", dest="import_", action="store_true", help=fallback)
    parser.add_argument("--cluster-root", type=Path, default=REPO / ".cluster")
    args = parser.parse_args(argv)
    build_args = dict(arg.split("=", 1) for arg in args.build_arg)
    try:
        image = build.build(log=log, build_args=build_args)
        print(f"image: {image.name}")
        print(f"archive: {image.archive} ({image.size_bytes / 2**20:.0f} MiB, {image.seconds:.0f}s)")
        if args.import_:
            loaded = build.import_into_node(image, args.cluster_root, log)
            print(f"loaded into the development node with ctr: {'yes' if loaded else 'no (no node running)'}")
            return 0 if loaded else 1
        registry = None if args.no_push else launch.load(args.cluster_root) and registry_mod.ClusterRegistry.load(
            args.cluster_root / "registry")  # fmt: skip
        if registry is None:
            print("pushed: no (no development cluster with a registry runs; `make cluster-up` starts one)")
            return 0
        published = build.publish(image, registry, helm.provide(log), log)
    except ControlPlaneError as exc:
        log(f"error: {exc}")
        return 1
    print(f"pushed: {published.image}")
    print(f"chart: {published.chart} --version {published.chart_version} ({published.chart_digest})")
    print("install it (the image by digest, pulled by the kubelet with a pull secret; `make cluster-up` applied")
    print("crds/, so the chart installs none):")
    registry_json = args.cluster_root / "registry" / registry_mod.CLUSTER_REGISTRY_FILE
    print("  " + "\n  ".join(published.install_commands(registry_json.resolve(), chart_crds=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
