"""Write OCI image archives without a container engine or a registry.

An image here is one uncompressed layer (a tar of a root filesystem) plus its
config; ``write_archive`` lays it out as an OCI image layout in a tar, which
``ctr images import`` loads into containerd under the name carried by the
``io.containerd.image.name`` annotation. Layer tars are made deterministic
(sorted entries, fixed mtimes, numeric owners) so the same tree gives the same
digest, which is what lets a test compare two builds.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
EPOCH = 0  # SOURCE_DATE_EPOCH-style: file times do not change a digest


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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in _tree(root):
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


def write_archive(out: Path, name: str, layer: Path, config: ImageConfig, *, architecture: str = "amd64") -> str:
    """An OCI image layout tar of one layer, named ``name`` for ``ctr images import``; returns the manifest digest."""
    diff_id = _sha256_file(layer)
    image_config = {
        "architecture": architecture,
        "os": "linux",
        "config": config.to_oci(),
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "metainfer hack/image.py (local build, no registry)"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": f"sha256:{config_digest}", "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": f"sha256:{diff_id}", "size": layer.stat().st_size}],
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
        info = tar.gettarinfo(str(layer), arcname=f"blobs/sha256/{diff_id}")
        info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "", ""
        with layer.open("rb") as handle:
            tar.addfile(info, handle)
    tmp.replace(out)
    return f"sha256:{manifest_digest}"


def read_config(archive: Path) -> dict[str, Any]:
    """The image config (``config`` part: Env, Entrypoint, User...) of an archive written by ``write_archive``."""
    with tarfile.open(archive) as tar:
        index = json.load(_member(tar, "index.json"))
        manifest_digest = index["manifests"][0]["digest"].split(":", 1)[1]
        manifest = json.load(_member(tar, f"blobs/sha256/{manifest_digest}"))
        config_digest = manifest["config"]["digest"].split(":", 1)[1]
        config: dict[str, Any] = json.load(_member(tar, f"blobs/sha256/{config_digest}"))["config"]
        return config


def _member(tar: tarfile.TarFile, name: str) -> io.BufferedReader:
    handle = tar.extractfile(name)
    if handle is None:
        raise ValueError(f"{name} is not a file in the archive")
    return handle  # type: ignore[return-value]


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(data))
