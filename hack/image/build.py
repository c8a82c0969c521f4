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
   chroot over that root filesystem, with its bind mounts provided by target (/dist: the
   wheel, as the builder stage's output; /locks: the flavour's lock, as the build
   context's locks/), and pip pointed at the wheelhouse.
4. Deterministic layers, one for the base and one per RUN (what it changed, see
   hack/controlplane/oci.py), and an OCI archive named ``metainfer.local/metainfer:<version>``.
   Each RUN's layer is cached under ~/.cache/metainfer/image/layers by what made it (the
   layers below, its script and environment, the contents of its mounts), as Docker's
   build cache does: a commit that changes only the project rebuilds only its own layer,
   and a registry or node that holds the dependencies' layer is sent only the new one.
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
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hack import cache_budget
from hack.controlplane import apt, oci
from hack.controlplane.assets import cache_root
from hack.controlplane.assets import lock as file_lock
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
LAYER_CACHE_DAYS = 7  # a cached RUN layer or wheelhouse no build used for this long is deleted
# Every flavour's layers of one lock take about 15 GiB (tar and tree); older locks' layers are evicted, least
# recently used first, beyond this, and whenever the filesystem has less than the floor free (hack/cache_budget.py).
LAYER_CACHE_BUDGET_GIB = 20
MIN_FREE_AFTER_BUILD_GIB = 24
# Another ONNX Runtime release than the one pyproject resolves to: the image a chart upgrade that changes the runtime
# brings (tests/e2e); tests/image builds and checks it first, so the e2e tier finds it made.
OTHER_ONNXRUNTIME = "1.31.1"


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
    # The cached layer tars the archive was made of, lowest first (empty when the archive was already up to date).
    layer_files: tuple[Path, ...] = ()


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
        apt.install(["mmdebstrap"])
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


def wheels(out: Path, log: Log = print) -> Path:
    """This checkout's wheel, alone in ``out/dist`` (the builder stage's /dist)."""
    dist = out / "dist"
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(REPO)], "building the wheel")
    (wheel,) = dist.glob("metainfer-*.whl")
    return wheel


def locks(out: Path) -> Path:
    """A copy of locks/ in ``out/locks``, where a build adds the locks it derives (another ONNX Runtime release)."""
    copy = out / "locks"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(REPO / "locks", copy)
    return copy


def lock_wheelhouse(lock: Path, out: Path, log: Log = print) -> Path:
    """Every wheel ``lock`` pins, checked against its hashes, in a folder keyed by the lock's contents (once)."""
    house = out / "wheels" / hashlib.sha256(lock.read_bytes()).hexdigest()[:16]
    complete = house / ".complete"
    if complete.exists():
        os.utime(house)  # its last use, which the cache budget evicts by
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
    (tests/e2e), without touching the default image's inputs.

    One build at a time on a machine (`make test` builds flavours in the image tier beside the e2e tier, and both
    share the wheel and lock folders): a second caller waits, then usually finds its image up to date."""
    started = time.monotonic()
    with _one_at_a_time(log):
        return _build(log, out_dir, dict(build_args or {}), onnxruntime, started)


def download_inputs(log: Log = print) -> list[Path]:
    """What a build on a cold cache downloads, fetched ahead of it into the same caches: the base root filesystem,
    and the wheelhouse of every lock under locks/ and of the cpu lock on ``OTHER_ONNXRUNTIME``. `make test` runs
    this beside the Go builds (hack/prefetch.py); the builds then find them. Returns the wheelhouses."""
    with _one_at_a_time(log):
        base_rootfs(log)
        work = cache_root() / "image" / "work"
        lock_dir = locks(work)
        _add_onnxruntime_lock(lock_dir, OTHER_ONNXRUNTIME, log)
        return [lock_wheelhouse(lock, work, log) for lock in sorted(lock_dir.glob("*.txt"))]


@contextlib.contextmanager
def _one_at_a_time(log: Log) -> Iterator[None]:
    """Root, and this machine's one image build (or download) at a time: they share the wheel and lock folders."""
    if os.geteuid() != 0:
        raise ImageError("make image needs root (chroot and bind mounts over the root filesystem)")
    started = time.monotonic()
    path = cache_root() / "image" / "build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        waited = time.monotonic() - started
        if waited > 1:
            log(f"waited {waited:.0f}s for another image build on this machine")
        yield


def _build(
    log: Log, out_dir: Path | None, build_args: dict[str, str], onnxruntime: str | None, started: float
) -> BuiltImage:
    out_dir = out_dir or REPO / "build" / "image"
    out_dir.mkdir(parents=True, exist_ok=True)
    base = base_rootfs(log)
    work = cache_root() / "image" / "work"
    wheel = wheels(work, log)
    lock_dir = locks(work)
    if onnxruntime is not None:
        build_args["RUNTIME"] = _add_onnxruntime_lock(lock_dir, onnxruntime, log)
    stage = dockerfile.parse(REPO / "Dockerfile", build_args, base_env=BASE_ENV)
    runtime = stage.args.get("RUNTIME", "")
    lock = lock_dir / f"{runtime}.txt"
    if not lock.is_file():
        known = sorted(p.stem for p in lock_dir.glob("*.txt"))
        raise ImageError(f"RUNTIME={runtime!r} has no lock (locks/{runtime}.txt); locked flavours: {known}")
    wheelhouse = lock_wheelhouse(lock, work, log)
    version = project_version() + ("" if runtime == "cpu" else f"-{runtime}")
    name = f"{IMAGE_REPOSITORY}:{version}"
    archive = out_dir / f"metainfer-{version}.oci.tar"
    key = _inputs_key(wheel, lock, base, stage.args)  # the ARGs as resolved: no build-arg and its default agree
    key_file = archive.with_name(archive.name + ".inputs")
    check_file = archive.with_name(archive.name + ".check.json")
    if archive.exists() and key_file.exists() and key_file.read_text() == key and check_file.exists():
        seconds = time.monotonic() - started
        log(f"{name} is up to date ({archive}): same wheel contents, lock, base and Dockerfile")
        check = json.loads(check_file.read_text())
        with tarfile.open(archive) as tar:
            digest = oci.read_manifest(tar).digest
        return BuiltImage(name, archive, digest, archive.stat().st_size, seconds,
                          check["runtime"], check["providers"])  # fmt: skip
    key_file.unlink(missing_ok=True)
    layers_dir = cache_root() / "image" / "layers"
    scratch = Path(tempfile.mkdtemp(prefix="build-", dir=_scratch_root()))  # beside the cache: layers move, not copy
    try:
        lock_mount = scratch / "locks"  # the one lock the flavour installs: its layer's key is that lock alone
        lock_mount.mkdir()
        shutil.copy2(lock, lock_mount / lock.name)
        lowers = [_base_tree(base, log)]
        layers = [layers_dir / f"{base.stem}.tar"]
        history = [f"mmdebstrap --variant=essential {SUITE} ({', '.join(BASE_PACKAGES)})"]
        sources = {"/dist": wheel.parent, "/locks": lock_mount}
        chain = hashlib.sha256(base.name.encode()).hexdigest()
        for index, run in enumerate(stage.runs):
            mounts = _mount_sources(run, sources)
            chain = _step_key(chain, run, mounts, wheelhouse)
            layer, tree = layers_dir / f"{chain[:32]}.tar", layers_dir / chain[:32]
            if layer.exists() and tree.is_dir():
                log(f"RUN {run.script[:80]}... (cached layer {layer.name})")
            else:
                log(f"RUN {run.script[:80]}...")
                with _overlay(lowers, scratch / f"run-{index}") as (rootfs, upper):
                    before = oci.snapshot(rootfs)
                    _chroot_run(rootfs, run.script, run.env, mounts=mounts, wheelhouse=wheelhouse)
                    oci.write_diff_layer(rootfs, before, layer)
                _keep(upper, tree)
            for used in (layer, tree):
                os.utime(used)
            lowers.append(tree)
            layers.append(layer)
            history.append(f"RUN {run.script}"[:1000])
        with _overlay(lowers, scratch / "check") as (rootfs, _):
            check = _entrypoint_check(rootfs, stage)
        log(f"{name}: {check['runtime']}; providers {check['providers']}")
        config = oci.ImageConfig(
            entrypoint=stage.entrypoint,
            cmd=stage.cmd,
            env=[f"{k}={v}" for k, v in stage.env.items()],
            user=stage.user,
            workdir=stage.workdir,
            exposed_ports=stage.exposed_ports,
        )
        digest = oci.write_archive(archive, name, layers, config, history=history)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    prune_image_cache(layers_dir, keep={*layers, *lowers})
    _prune_wheelhouses(wheelhouse.parent.parent, wheelhouse)
    check_file.write_text(json.dumps(check))
    key_file.write_text(key)
    seconds = time.monotonic() - started
    log(f"built {name} ({archive}, {archive.stat().st_size / 2**20:.0f} MiB) in {seconds:.0f}s")
    return BuiltImage(name, archive, digest, archive.stat().st_size, seconds, check["runtime"], check["providers"],
                      tuple(layers))  # fmt: skip


def layer_sizes(archive: Path) -> list[int]:
    """The size in bytes of each layer of an image archive, lowest first."""
    with tarfile.open(archive) as tar:
        return [int(layer["size"]) for layer in oci.read_manifest(tar).layers]


def _scratch_root() -> Path:
    root = cache_root() / "image" / "scratch"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _base_tree(base: Path, log: Log) -> Path:
    """The base root filesystem unpacked (the lowest directory of every build's overlay) and as a layer tar,
    both made once per base."""
    layers_dir = cache_root() / "image" / "layers"
    tree, layer = layers_dir / base.stem, layers_dir / f"{base.stem}.tar"
    if not tree.is_dir():
        log(f"unpacking the base root filesystem into {tree}")
        unpacked = Path(tempfile.mkdtemp(prefix="base-", dir=_scratch_root()))
        _run(["tar", "-xf", str(base), "-C", str(unpacked), "--numeric-owner"], "unpacking the base")
        _keep(unpacked, tree)
    if not layer.exists():
        oci.write_layer(tree, layer)
    for used in (tree, layer):
        os.utime(used)
    return tree


def _keep(directory: Path, tree: Path) -> None:
    """Move a finished ``directory`` into the cache as ``tree``; another build that got there first wins."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.rename(tree)
    except OSError:
        if not tree.is_dir():
            raise
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _overlay(lowers: list[Path], scratch: Path) -> Iterator[tuple[Path, Path]]:
    """A writable root filesystem: the cached trees ``lowers`` (lowest first, never written) under a fresh upper
    directory, as a container runtime stacks layers. Yields the merged root and the upper directory, which holds
    exactly what was written (as the next RUN's lower directory it is that RUN's layer)."""
    upper, work, merged = scratch / "upper", scratch / "work", scratch / "merged"
    for directory in (upper, work, merged):
        directory.mkdir(parents=True)
    options = f"lowerdir={':'.join(str(p) for p in reversed(lowers))},upperdir={upper},workdir={work}"
    _run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], "mounting the build's root filesystem")
    try:
        yield merged, upper
    finally:
        if subprocess.run(["umount", str(merged)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(merged)], capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)


def _mount_sources(run: dockerfile.Run, sources: dict[str, Path]) -> dict[str, Path]:
    unknown = [target for target in run.mounts if target not in sources]
    if unknown:
        raise ImageError(f"RUN mounts {unknown}, which make image does not provide (it provides {sorted(sources)})")
    return {target: sources[target] for target in run.mounts}


def _step_key(below: str, run: dockerfile.Run, mounts: dict[str, Path], wheelhouse: Path) -> str:
    """What a RUN's layer is made of: the layers below, its environment and script, what its mounts hold (a
    wheel by its files, not its zip timestamps) and the wheelhouse pip installs from (named by its lock)."""
    digest = hashlib.sha256(below.encode())
    digest.update(repr(sorted(run.env.items())).encode() + b"\0" + run.script.encode())
    for target, source in sorted(mounts.items()):
        digest.update(b"\0mount " + target.encode())
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            digest.update(b"\0" + str(path.relative_to(source)).encode() + b"\0")
            digest.update(_wheel_contents(path) if path.suffix == ".whl" else path.read_bytes())
    digest.update(b"\0wheelhouse " + wheelhouse.name.encode())
    return digest.hexdigest()


def _wheel_contents(wheel: Path) -> bytes:
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zipped:
        for entry in sorted(zipped.namelist()):
            digest.update(entry.encode() + b"\0" + zipped.read(entry))
    return digest.digest()


def prune_image_cache(layers_dir: Path, keep: set[Path]) -> None:
    """Evict the cached layers (tar and tree together) this build did not use, least recently used first, beyond
    the layer budget or the free-space floor, and any unused for LAYER_CACHE_DAYS."""
    names = {path.name.removesuffix(".tar") for path in layers_dir.iterdir()}
    _evict_within_budget([[layers_dir / name, layers_dir / f"{name}.tar"] for name in sorted(names)], keep)


def _prune_wheelhouses(work: Path, keep: Path) -> None:
    houses = work / "wheels"
    if houses.is_dir():
        _evict_within_budget([[house] for house in houses.iterdir() if house.is_dir()], {keep})


def _evict_within_budget(groups: list[list[Path]], keep: set[Path]) -> None:
    cache_budget.evict(
        [cache_budget.entry(group) for group in groups],
        keep,
        budget_bytes=LAYER_CACHE_BUDGET_GIB * cache_budget.GIB,
        min_free_bytes=MIN_FREE_AFTER_BUILD_GIB * cache_budget.GIB,
        max_age_s=LAYER_CACHE_DAYS * 86400,
    )


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
    digest = hashlib.sha256(_wheel_contents(wheel))
    digest.update(lock.read_bytes())
    digest.update(base.name.encode() + (REPO / "Dockerfile").read_bytes())
    digest.update(repr(sorted(build_args.items())).encode())
    return digest.hexdigest()


def _chroot_run(rootfs: Path, script: str, env: dict[str, str], *, mounts: dict[str, Path], wheelhouse: Path) -> None:
    """One RUN instruction: /bin/sh -c in a chroot with /proc, its bind mounts and the wheelhouse mounted."""
    run_env = {
        **env,
        # The builder stage's output and the package index, both local: the build reaches no network.
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": "/wheels",
    }
    with _mounted(rootfs, {**mounts, "/wheels": wheelhouse}):
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
def _mounted(rootfs: Path, binds: dict[str, Path]) -> Iterator[None]:
    """/proc, and each source read-only at its target; the targets made here are removed again, so that a RUN's
    layer holds none of them (Docker's mounts leave nothing in a layer either)."""
    mounts: list[Path] = []
    made: list[Path] = []
    try:
        for source, target, options in (
            ("proc", rootfs / "proc", ["-t", "proc"]),
            *((str(path), rootfs / target.lstrip("/"), ["--bind", "-o", "ro"]) for target, path in binds.items()),
        ):
            if not target.exists():
                target.mkdir()
                made.append(target)
            _run(["mount", *options, source, str(target)], f"mounting {target}")
            mounts.append(target)
        yield
    finally:
        for target in reversed(mounts):
            subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)
        for target in reversed(made):
            with contextlib.suppress(OSError):
                target.rmdir()


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
    digest = registry.push_image(image.archive, "metainfer", tag)
    chart, version, chart_digest = registry.push_chart(helm, REPO / "charts" / "metainfer", REPO / "build" / "chart")
    log(f"pushed {registry.address}/metainfer:{tag} ({digest}) and {chart}:{version} in "
        f"{time.monotonic() - started:.0f}s")  # fmt: skip
    return Published(registry, f"{registry.address}/metainfer", digest, chart, version, chart_digest)


def _run(cmd: list[str], what: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"{what} failed ({' '.join(cmd[:4])}..., exit {result.returncode}):\n{result.stderr[-2000:]}")
