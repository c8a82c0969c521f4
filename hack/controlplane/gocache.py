"""Drop Go's build and module caches once every tool built with Go is cached as a binary.

`make assets` builds kube-apiserver, etcd, the node's binaries (kube-router too), helm, the registry, the object
store, the Prometheus with Kubernetes discovery and the pause image from source; each lands in the metainfer cache
as a finished binary and is never rebuilt unless its pinned version changes. Go's own caches behind them
(compiled packages and downloaded modules) then weigh about 15 GiB on a disk that the development node's images
and the image builds share with the host, and a CI run that ran the node out of disk lost its operator to
eviction. A pinned version bump
downloads and compiles again: minutes, once.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from hack.controlplane import assets, pause
from hack.controlplane.errors import AssetError


def _size(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return sum(path.lstat().st_size for path in directory.rglob("*") if path.is_file() and not path.is_symlink())


def trim(log: assets.Log = print) -> int:
    """Remove GOCACHE and GOMODCACHE under the metainfer cache; returns the bytes freed.

    The pause image is built first: it is the one Go build the node makes on its first start, after `make assets`.
    Two `make assets` at once (a developer's beside a test run's) can both reach the trim: one at a time, and the
    second finds nothing to drop."""
    root = assets.cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with assets.lock(root / "go-trim.lock"):
        return _trim_unlocked(log)


def _trim_unlocked(log: assets.Log) -> int:
    pause.archive(log)
    env = assets.go_env()
    caches = [Path(env["GOCACHE"]), Path(env["GOMODCACHE"])]
    before = sum(_size(directory) for directory in caches)
    if before == 0:
        return 0
    go = shutil.which("go")
    if go is not None:  # go clean makes the module cache's read-only files writable before removing them
        result = subprocess.run([go, "clean", "-cache", "-modcache"], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise AssetError(f"go clean -cache -modcache failed: {result.stderr.strip()[-1000:]}")
    for directory in caches:  # without go, or what go clean leaves (the cache's README and trim stamp)
        shutil.rmtree(directory, ignore_errors=True)
    freed = before - sum(_size(directory) for directory in caches)
    log(f"dropped Go's build and module caches ({freed / 2**30:.1f} GiB): every Go-built tool is cached as a binary")
    return freed


if __name__ == "__main__":
    try:
        trim(lambda message: print(message, file=sys.stderr))
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
