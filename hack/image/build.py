"""Build the project's image with no container engine and no registry (`make image`).

1. A Debian root filesystem from the machine's own apt sources (mmdebstrap,
   cached under ~/.cache/metainfer/image keyed by the package list): the local
   stand-in for the Dockerfile's ``BASE_IMAGE`` (Debian bookworm, whose python3 is
   the Dockerfile's default ``PYTHON_VERSION``).
2. The wheel of this checkout, and a wheelhouse of exactly the wheels the flavour's
   lock (locks/<RUNTIME>.txt, hashes included) names, downloaded on the host from the
   package index once per lock (this machine's Python is the image's: CPython 3.11 on
   glibc x86_64, so the same wheels fit).
3. The Dockerfile's runtime stage, executed instruction by instruction in a
   chroot over that root filesystem, with the wheel bind-mounted at /dist as the
   builder stage's output is (the wheel and locks/), and pip pointed at the wheelhouse.
4. One deterministic layer and an OCI archive named ``metainfer.local/metainfer:<version>``,
   loaded into the development node's containerd when one runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hack.controlplane import oci
from hack.controlplane.assets import cache_root
from hack.controlplane.errors import ControlPlaneError
from hack.controlplane.registry import ClusterRegistry
from hack.image import dockerfile

Log = Callable[[str], None]
REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
# python3-venv: the Dockerfile makes a venv; libstdc++6/libgomp1: onnxruntime's and scikit-learn's wheels link them.
BASE_PACKAGES = ("python3", "python3-venv", "libstdc++6", "libgomp1", "ca-certificates")
# The environment python:<version>-slim-bookworm gives its children that the Dockerfile relies on.
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
IMAGE_REPOSITORY = "metainfer.local/metainfer"


class ImageError(ControlPlaneError):
    pass


@dataclass(frozen=True)
class BuiltImage:
    name: str
    archive: Path
    manifest_digest: str
    size_bytes: int
    seconds: float
    # What the image's ENTRYPOINT printed for `runtime --providers`, run as the image's USER in its WORKDIR with
    # its ENV: the runtime identity, and per execution provider None (a session on it runs on the build host)
    # or why not.
    runtime: str = ""
    providers: dict[str, str | None] = field(default_factory=dict)


def project_version() -> str:
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def base_rootfs(log: Log = print) -> Path:
    """The cached Debian root filesystem tar, made with mmdebstrap from the host's apt sources if missing."""
    sources = _apt_sources()
    key = hashlib.sha256("\n".join([SUITE, *BASE_PACKAGES]).encode()).hexdigest()[:16]
    out = cache_root() / "image" / f"base-{SUITE}-{key}.tar"
    if out.exists():
        return out
    if shutil.which("mmdebstrap") is None:
        _apt_install(["mmdebstrap"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    started = time.monotonic()
    log(f"making the base root filesystem ({SUITE}: {', '.join(BASE_PACKAGES)}) with mmdebstrap")
    cmd = [
        "mmdebstrap",
        "--variant=essential",
        "--mode=root",
        "--format=tar",
        f"--include={','.join(BASE_PACKAGES)}",
        SUITE,
        str(tmp),
        str(sources),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ImageError(f"mmdebstrap failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    tmp.replace(out)
    log(f"base root filesystem {out} in {time.monotonic() - started:.0f}s")
    return out


def _apt_sources() -> Path:
    for candidate in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if candidate.is_file() and candidate.read_text().strip():
            return candidate
    raise ImageError("no apt sources on this machine (/etc/apt/sources.list[.d]): mmdebstrap needs a Debian mirror")


def _apt_install(packages: list[str]) -> None:
    result = subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        capture_output=True,
        text=True,
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        check=False,
    )
    if result.returncode != 0:
        raise ImageError(f"apt-get install {' '.join(packages)} failed:\n{result.stderr[-1500:]}")


def wheels(out: Path, log: Log = print) -> Path:
    """This checkout's wheel in ``out/dist`` beside a copy of locks/ (the builder stage's /dist)."""
    dist = out / "dist"
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(REPO)], "building the wheel")
    (wheel,) = dist.glob("metainfer-*.whl")
    shutil.copytree(REPO / "locks", dist / "locks")
    return wheel


def lock_wheelhouse(lock: Path, out: Path, log: Log = print) -> Path:
    """Every wheel ``lock`` pins, checked against its hashes, in a folder keyed by the lock's contents (once)."""
    house = out / "wheels" / hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    complete = house / ".complete"
    if complete.exists():
        return house
    if house.exists():
        shutil.rmtree(house)
    house.mkdir(parents=True)
    log(f"downloading the wheels {lock.name} pins into {house}")
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--require-hashes"]
    _run([*pip, "--dest", str(house), "-r", str(lock)], f"downloading the wheels of {lock.name}")
    complete.touch()
    return house


def lock_with_onnxruntime(lock_text: str, release: str, wheel: Path) -> str:
    """``lock_text`` with its onnxruntime pin replaced by ``release``, hashed by the wheel downloaded for it."""
    entry = re.compile(r"^onnxruntime==\S+ \\\n(?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", re.M)
    if len(entry.findall(lock_text)) != 1:
        raise ImageError("the cpu lock has no single onnxruntime pin to replace")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return entry.sub(f"onnxruntime=={release} \\\n    --hash=sha256:{digest}\n", lock_text)


def build(
    *,
    log: Log = print,
    out_dir: Path | None = None,
    build_args: dict[str, str] | None = None,
    onnxruntime: str | None = None,
) -> BuiltImage:
    """Build the image archive (see the module docstring); returns where it is and what it weighs.

    ``build_args["RUNTIME"]`` picks the flavour's lock (default cpu); a flavour other than cpu is tagged
    ``<version>-<flavour>``. ``onnxruntime`` (a version, e.g. ``1.31.1``) builds the same project on another ONNX
    Runtime release, tagged ``<version>-cpu-onnxruntime<release>``: a chart upgrade that changes the runtime
    (tests/e2e), without touching the default image's inputs."""
    if os.geteuid() != 0:
        raise ImageError("make image needs root (chroot and bind mounts over the root filesystem)")
    started = time.monotonic()
    out_dir = out_dir or REPO / "build" / "image"
    out_dir.mkdir(parents=True, exist_ok=True)
    base = base_rootfs(log)
    work = cache_root() / "image" / "work"
    wheel = wheels(work, log)
    build_args = dict(build_args or {})
    if onnxruntime is not None:
        build_args["RUNTIME"] = _add_onnxruntime_lock(wheel.parent / "locks", onnxruntime, log)
    stage = dockerfile.parse(REPO / "Dockerfile", build_args, base_env=BASE_ENV)
    runtime = stage.args.get("RUNTIME", "")
    lock = wheel.parent / "locks" / f"{runtime}.txt"
    if not lock.is_file():
        known = sorted(p.stem for p in (wheel.parent / "locks").glob("*.txt"))
        raise ImageError(f"RUNTIME={runtime!r} has no lock (locks/{runtime}.txt); locked flavours: {known}")
    wheelhouse = lock_wheelhouse(lock, work, log)
    version = project_version() + ("" if runtime == "cpu" else f"-{runtime}")
    name = f"{IMAGE_REPOSITORY}:{version}"
    archive = out_dir / f"metainfer-{version}.oci.tar"
    key = _inputs_key(wheel, lock, base, build_args)
    key_file = archive.with_name(archive.name + ".inputs")
    check_file = archive.with_name(archive.name + ".check.json")
    if archive.exists() and key_file.exists() and key_file.read_text() == key and check_file.exists():
        seconds = time.monotonic() - started
        log(f"{name} is up to date ({archive}): same wheel contents, lock, base and Dockerfile")
        check = json.loads(check_file.read_text())
        return BuiltImage(name, archive, _manifest_digest(archive), archive.stat().st_size, seconds,
                          check["runtime"], check["providers"])  # fmt: skip
    key_file.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="metainfer-image-", dir=out_dir) as tmp:
        rootfs = Path(tmp, "rootfs")
        rootfs.mkdir()
        _run(["tar", "-xf", str(base), "-C", str(rootfs), "--numeric-owner"], "unpacking the base")
        for env, script in stage.runs:
            log(f"RUN {script[:80]}...")
            _chroot_run(rootfs, script, env, dist=wheel.parent, wheelhouse=wheelhouse)
        check = _entrypoint_check(rootfs, stage)
        log(f"{name}: {check['runtime']}; providers {check['providers']}")
        layer = Path(tmp, "layer.tar")
        oci.write_layer(rootfs, layer)
        config = oci.ImageConfig(
            entrypoint=stage.entrypoint,
            cmd=stage.cmd,
            env=[f"{k}={v}" for k, v in stage.env.items()],
            user=stage.user,
            workdir=stage.workdir,
            exposed_ports=stage.exposed_ports,
        )
        digest = oci.write_archive(archive, name, layer, config)
    check_file.write_text(json.dumps(check))
    key_file.write_text(key)
    seconds = time.monotonic() - started
    log(f"built {name} ({archive}, {archive.stat().st_size / 2**20:.0f} MiB) in {seconds:.0f}s")
    return BuiltImage(name, archive, digest, archive.stat().st_size, seconds, check["runtime"], check["providers"])


def _entrypoint_check(rootfs: Path, stage: dockerfile.RuntimeStage) -> dict[str, Any]:
    """``ENTRYPOINT runtime --providers`` as the container would run it (USER, WORKDIR, ENV, nothing else): the
    image starts as its user, and its ONNX Runtime offers the EPs of its flavour; ``providers`` says which of them
    run on this host (no GPU here: CUDA's reason is ONNX Runtime's own)."""
    argv = [
        "chroot", f"--userspec={stage.user or '0:0'}", str(rootfs),
        "/usr/bin/env", "-i", "-C", stage.workdir or "/", *(f"{k}={v}" for k, v in stage.env.items()),
        *stage.entrypoint, "runtime", "--providers",
    ]  # fmt: skip
    with _proc_mounted(rootfs):
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise ImageError(f"the image's entrypoint failed (exit {result.returncode}): {' '.join(argv[3:])[:300]}\n"
                         f"{result.stderr[-3000:]}")  # fmt: skip
    try:
        report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise ImageError(f"the image's `runtime --providers` printed no JSON: {result.stdout[-500:]!r}") from None
    return report


@contextlib.contextmanager
def _proc_mounted(rootfs: Path) -> Iterator[None]:
    target = rootfs / "proc"
    target.mkdir(exist_ok=True)
    _run(["mount", "-t", "proc", "proc", str(target)], f"mounting {target}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


def _add_onnxruntime_lock(locks: Path, release: str, log: Log) -> str:
    """A lock beside the others that is the cpu one with ``onnxruntime==release`` (its wheel from the package index,
    once); returns its flavour name for the RUNTIME build arg."""
    cached = cache_root() / "image" / "onnxruntime" / release
    if not list(cached.glob("onnxruntime-*.whl")):
        log(f"downloading onnxruntime {release}'s wheel")
        cached.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        _run([*pip, "--dest", str(cached), f"onnxruntime=={release}"], f"downloading onnxruntime {release}")
    (wheel,) = cached.glob("onnxruntime-*.whl")
    name = f"cpu-onnxruntime{release}"
    (locks / f"{name}.txt").write_text(lock_with_onnxruntime((locks / "cpu.txt").read_text(), release, wheel))
    return name


def _inputs_key(wheel: Path, lock: Path, base: Path, build_args: dict[str, str]) -> str:
    """What the image is made of: the wheel's files (not its zip timestamps), the lock, base, Dockerfile."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zipped:
        for entry in sorted(zipped.namelist()):
            digest.update(entry.encode() + b"\0" + zipped.read(entry))
    digest.update(lock.read_bytes())
    digest.update(base.name.encode() + (REPO / "Dockerfile").read_bytes())
    digest.update(repr(sorted(build_args.items())).encode())
    return digest.hexdigest()


def _manifest_digest(archive: Path) -> str:
    import tarfile

    with tarfile.open(archive) as tar:
        handle = tar.extractfile("index.json")
        assert handle is not None
        return str(json.load(handle)["manifests"][0]["digest"])


def _chroot_run(rootfs: Path, script: str, env: dict[str, str], *, dist: Path, wheelhouse: Path) -> None:
    """One RUN instruction: /bin/sh -c in a chroot with /proc, /dev, the wheel and the wheelhouse mounted."""
    run_env = {
        **env,
        # The builder stage's output and the package index, both local: the build reaches no network.
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "/wheels",
    }
    with _mounted(rootfs, dist, wheelhouse):
        argv = [
            "chroot",
            str(rootfs),
            "/usr/bin/env",
            "-i",
            *(f"{k}={v}" for k, v in run_env.items()),
            "/bin/sh",
            "-c",
            script,
        ]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"RUN failed (exit {result.returncode}): {script[:200]}\n{result.stderr[-3000:]}")


@contextlib.contextmanager
def _mounted(rootfs: Path, dist: Path, wheelhouse: Path) -> Iterator[None]:
    mounts: list[Path] = []
    try:
        for source, target, options in (
            ("proc", rootfs / "proc", ["-t", "proc"]),
            (str(dist), rootfs / "dist", ["--bind", "-o", "ro"]),
            (str(wheelhouse), rootfs / "wheels", ["--bind", "-o", "ro"]),
        ):
            target.mkdir(exist_ok=True)
            _run(["mount", *options, source, str(target)], f"mounting {target}")
            mounts.append(target)
        yield
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)
        for name in ("dist", "wheels"):
            with contextlib.suppress(OSError):
                (rootfs / name).rmdir()


def import_into_node(image: BuiltImage, cluster_root: Path, log: Log = print) -> bool:
    """Load the archive into the development node's containerd if one runs under ``cluster_root``."""
    from hack.controlplane import node as node_mod

    paths = node_mod.NodePaths(cluster_root / "node")
    if not node_mod.containerd_ready(paths):
        return False
    started = time.monotonic()
    node_mod.import_image(paths, image.archive)
    log(f"loaded {image.name} into the node's containerd in {time.monotonic() - started:.0f}s")
    return True


@dataclass(frozen=True)
class Published:
    """An image and the chart in the development cluster's registry, and how to install them from there."""

    registry: ClusterRegistry
    repository: str  # <registry>/metainfer
    digest: str
    chart: str  # oci://<registry>/charts/metainfer
    chart_version: str
    chart_digest: str

    @property
    def image(self) -> str:
        return f"{self.repository}@{self.digest}"

    def install_commands(self, registry_json: Path, release: str = "metainfer", namespace: str = "metainfer-system",
                         pull_secret: str = "metainfer-registry", chart_crds: bool = True) -> list[str]:  # fmt: skip
        """Shell lines: the pull secret (in the release namespace; workload namespaces need one too) and helm
        install from the registry, the image pinned by digest. The password is read from ``registry_json`` (the
        cluster's saved ClusterRegistry), never shown. ``chart_crds=False`` where the CRDs were applied from crds/
        (as `make cluster-up` does): the chart then leaves them alone."""
        password = f'$(python3 -c \'import json; print(json.load(open("{registry_json}"))["password"])\')'
        user = self.registry.credentials.username
        return [
            f"PASSWORD={password}",
            f"kubectl create namespace {namespace}",
            f"kubectl -n {namespace} create secret docker-registry {pull_secret} "
            f'--docker-server={self.registry.address} --docker-username={user} --docker-password="$PASSWORD"',
            f'echo "$PASSWORD" | helm registry login {self.registry.address} --username {user} --password-stdin '
            f"--ca-file {self.registry.ca}",
            f"helm install {release} {self.chart} --version {self.chart_version} -n {namespace} "
            f"--ca-file {self.registry.ca} "
            f"--set image.repository={self.repository} --set image.digest={self.digest} "
            f"--set 'imagePullSecrets[0].name={pull_secret}' --set 'workloads.imagePullSecrets[0].name={pull_secret}'"
            + ("" if chart_crds else " --set crds.enabled=false"),
        ]


def publish(image: BuiltImage, registry: ClusterRegistry, helm: Path, log: Log = print) -> Published:
    """Push ``image`` to ``registry`` (as metainfer:<its tag>) and the chart beside it (oci://.../charts)."""
    started = time.monotonic()
    tag = image.name.rsplit(":", 1)[1]
    scratch = cache_root() / "image" / "push"
    digest = registry.push_image(image.archive, "metainfer", tag, scratch)
    chart, version, chart_digest = registry.push_chart(helm, REPO / "charts" / "metainfer", REPO / "build" / "chart")
    log(f"pushed {registry.address}/metainfer:{tag} ({digest}) and {chart}:{version} in "
        f"{time.monotonic() - started:.0f}s")  # fmt: skip
    return Published(registry, f"{registry.address}/metainfer", digest, chart, version, chart_digest)


def _run(cmd: list[str], what: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"{what} failed ({' '.join(cmd[:4])}..., exit {result.returncode}):\n{result.stderr[-2000:]}")
