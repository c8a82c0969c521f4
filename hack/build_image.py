#!/usr/bin/env python3
"""`make image`: build metainfer.local/metainfer:<version> with no container engine or registry.

    PYTHONSAFEPATH=1 .venv/bin/python hack/build_image.py [--build-arg NAME=VALUE ...] [--no-load]

Follows the Dockerfile's runtime stage (see hack/image/build.py), writes
build/image/metainfer-<version>.oci.tar and loads it into the development
node's containerd when `make cluster-up` runs one. Users with a registry build
the same image with `docker build` (docs/real-cluster.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hack.controlplane.errors import ControlPlaneError
from hack.image import build

REPO = Path(__file__).resolve().parents[1]


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--no-load", action="store_true", help="do not load it into the development node")
    parser.add_argument("--cluster-root", type=Path, default=REPO / ".cluster")
    args = parser.parse_args(argv)
    build_args = dict(arg.split("=", 1) for arg in args.build_arg)
    try:
        image = build.build(log=log, build_args=build_args)
        loaded = False if args.no_load else build.import_into_node(image, args.cluster_root, log)
    except ControlPlaneError as exc:
        log(f"error: {exc}")
        return 1
    print(f"image: {image.name}")
    print(f"archive: {image.archive} ({image.size_bytes / 2**20:.0f} MiB, {image.seconds:.0f}s)")
    print(f"loaded into the development node: {'yes' if loaded else 'no (no node running)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
