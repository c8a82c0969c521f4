"""Write OCI image archives without a container engine or a registry.

An image here is a stack of uncompressed layers (tars of a root filesystem and
of what each build step changed in it) plus its config; ``write_archive`` lays
it out as an OCI image layout in a tar, which ``ctr images import`` loads into
containerd under the name carried by the ``io.containerd.image.name``
annotation. Layer tars are made deterministic (sorted entries, fixed mtimes,
numeric owners) so the same tree gives the same digest, which is what lets a
test compare two builds, a registry skip a layer it holds and a node pull only
the layers it lacks.

A step's layer is the difference between two ``snapshot``s of the tree: what
was added or changed, with the OCI whiteout ``.wh.<name>`` for what was
removed, which a container runtime applies to the layers below.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
EPOCH = 0  # SOURCE_DATE_EPOCH-style: file times do not change a digest
WHITEOUT = ".wh."  # OCI image spec: ``dir/.wh.name`` in a layer removes ``dir/name`` of the layers below

# What tells two states of one path apart: type and mode, owner, size, modification time, a link's target.
Signature = tuple[int, int, int, int, int, str]


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config: what a Dockerfile's ENV/USER/WORKDIR/ENTRYPOINT/CMD/EXPOSE say."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    user: str = ""
    workdir: str = ""
    exposed_ports: list[str] = field(default_factory=list)

    def to_oci(self) -> dict[str, Any]:
        config: dict[str, Any] = {"Env": self.env, "Entrypoint": self.entrypoint, "Cmd": self.cmd}
        if self.user:
            config["User"] = self.user
        if self.workdir:
            config["WorkingDir"] = self.workdir
        if self.exposed_ports:
            config["ExposedPorts"] = {port: {} for port in self.exposed_ports}
        return config


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tree(root: Path) -> list[Path]:
    """Every path under ``root``, sorted so parents come before children, without following links."""
    paths: list[Path] = []
    for directory, dirnames, filenames in os.walk(root):
        paths += [Path(directory, name) for name in (*dirnames, *filenames)]
    return sorted(paths, key=lambda p: p.relative_to(root).parts)


def write_layer(root: Path, out: Path) -> str:
    """A deterministic tar of the tree under ``root``; returns its sha256 (the layer's diff id)."""
    return _write_tar(root, _tree(root), (), out)


def snapshot(root: Path) -> dict[str, Signature]:
    """Every path under ``root`` (relative, POSIX) with what distinguishes its states, for ``write_diff_layer``."""
    return {str(path.relative_to(root)): _signature(path) for path in _tree(root)}


def write_diff_layer(root: Path, before: Mapping[str, Signature], out: Path) -> str:
    """A deterministic tar of what changed under ``root`` since ``before`` (a ``snapshot``): added and changed
    paths with every parent directory, and a whiteout for each removed path whose parent is still there; returns
    its sha256. Applied over the layers that made ``before``, it gives the tree as it is now."""
    now = snapshot(root)
    changed = {name for name, signature in now.items() if before.get(name) != signature}
    for name in list(changed):
        changed.update(str(parent) for parent in Path(name).parents if str(parent) != ".")
    gone = {name for name in before if name not in now}
    removed = [name for name in gone if str(Path(name).parent) not in gone]  # a removed tree needs one whiteout
    paths = sorted((root / name for name in changed), key=lambda p: p.relative_to(root).parts)
    whiteouts = sorted(str(Path(name).parent / f"{WHITEOUT}{Path(name).name}") for name in removed)
    return _write_tar(root, paths, whiteouts, out)


def _signature(path: Path) -> Signature:
    info = path.lstat()
    link = os.readlink(path) if stat.S_ISLNK(info.st_mode) else ""
    return (info.st_mode, info.st_uid, info.st_gid, info.st_size, info.st_mtime_ns, link)


def _write_tar(root: Path, paths: Sequence[Path], whiteouts: Sequence[str], out: Path) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in whiteouts:
            _add_bytes(tar, name, b"")
        for path in paths:
            if stat.S_ISSOCK(path.lstat().st_mode):
                continue  # a socket cannot be archived, and no image needs one
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.mtime = EPOCH
            info.uname = info.gname = ""
            if info.isfile():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    tmp.replace(out)
    return _sha256_file(out)


def write_archive(
    out: Path,
    name: str,
    layers: Sequence[Path],
    config: ImageConfig,
    *,
    history: Sequence[str] = (),
    architecture: str = "amd64",
) -> str:
    """An OCI image layout tar of ``layers`` (lowest first), named ``name`` for ``ctr images import``; ``history``
    says what made each layer. Returns the manifest digest."""
    if not layers:
        raise ValueError("an image needs at least one layer")
    if history and len(history) != len(layers):
        raise ValueError(f"{len(history)} history entries for {len(layers)} layers")
    diff_ids = [_sha256_file(layer) for layer in layers]
    created_by = list(history) or ["metainfer hack/controlplane/oci.py (local build, no registry)"] * len(layers)
    image_config = {
        "architecture": architecture,
        "os": "linux",
        "config": config.to_oci(),
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
        "history": [{"created_by": line} for line in created_by],
    }
    config_bytes = json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": f"sha256:{config_digest}", "size": len(config_bytes)},
        "layers": [
            {"mediaType": LAYER_MEDIA_TYPE, "digest": f"sha256:{diff_id}", "size": layer.stat().st_size}
            for diff_id, layer in zip(diff_ids, layers, strict=True)
        ],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = hashlib.sha256(manifest_bytes).hexdigest()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": f"sha256:{manifest_digest}",
                "size": len(manifest_bytes),
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name},
                "platform": {"architecture": architecture, "os": "linux"},
            }
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(tar, "index.json", json.dumps(index).encode())
        _add_bytes(tar, f"blobs/sha256/{config_digest}", config_bytes)
        _add_bytes(tar, f"blobs/sha256/{manifest_digest}", manifest_bytes)
        for diff_id, layer in sorted(dict(zip(diff_ids, layers, strict=True)).items()):
            info = tar.gettarinfo(str(layer), arcname=f"blobs/sha256/{diff_id}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "", ""
            with layer.open("rb") as handle:
                tar.addfile(info, handle)
    tmp.replace(out)
    return f"sha256:{manifest_digest}"


@dataclass(frozen=True)
class ArchiveManifest:
    """The one manifest of an OCI image archive: its bytes as stored (what a registry is sent), its digest and the
    descriptors it names."""

    raw: bytes
    digest: str
    config: dict[str, Any]
    layers: list[dict[str, Any]]

    @property
    def blob_digests(self) -> list[str]:
        """The config's digest, then each layer's, lowest first."""
        return [str(descriptor["digest"]) for descriptor in [self.config, *self.layers]]


class ArchiveError(ValueError):
    """An image archive that is not what ``write_archive`` writes."""


def read_manifest(tar: tarfile.TarFile) -> ArchiveManifest:
    """The manifest that the archive's index names (exactly one, as ``write_archive`` writes)."""
    index = json.load(member(tar, "index.json"))
    entries = index.get("manifests", [])
    if len(entries) != 1:
        raise ArchiveError(f"index.json names {len(entries)} manifests; expected exactly one")
    raw = member(tar, blob_name(entries[0]["digest"])).read()
    manifest = json.loads(raw)
    return ArchiveManifest(raw, str(entries[0]["digest"]), manifest["config"], list(manifest["layers"]))


def read_config(archive: Path) -> dict[str, Any]:
    """The image config (``config`` part: Env, Entrypoint, User...) of an archive written by ``write_archive``."""
    with tarfile.open(archive) as tar:
        manifest = read_manifest(tar)
        config: dict[str, Any] = json.load(member(tar, blob_name(manifest.config["digest"])))["config"]
        return config


def member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    """A regular file of the archive, opened for reading."""
    try:
        handle = tar.extractfile(name)
    except KeyError:
        handle = None
    if handle is None:
        raise ArchiveError(f"{name} is missing from the image archive (or is not a file)")
    return handle


def blob_name(digest: str) -> str:
    """Where an OCI layout stores the blob of ``digest`` (``sha256:<hex>``)."""
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(data))
