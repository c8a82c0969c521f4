"""The pod sandbox image, built here: a static Go binary in an otherwise empty image."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from hack.controlplane import oci
from hack.controlplane.assets import Log, cache_root, find_go, go_env, lock
from hack.controlplane.errors import AssetError
from hack.controlplane.node import PAUSE_IMAGE

SOURCE = Path(__file__).with_name("pause")


def archive(log: Log = print) -> Path:
    """The pause image's OCI archive, cached under the metainfer cache keyed by its source; one builder at a time,
    written beside its final name and renamed, so a reader never sees half an archive."""
    import hashlib

    key = hashlib.sha256((SOURCE / "main.go").read_bytes() + (SOURCE / "go.mod").read_bytes()).hexdigest()[:16]
    out = cache_root() / "images" / f"pause-{key}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with lock(out.with_suffix(".lock")):
        if not out.exists():  # another process may have built it while we waited
            _build(out, log)
    return out


def _build(out: Path, log: Log) -> None:
    with tempfile.TemporaryDirectory(prefix="metainfer-pause-") as tmp:
        rootfs = Path(tmp, "rootfs")
        rootfs.mkdir()
        work = Path(tmp, "src")
        shutil.copytree(SOURCE, work)
        env = go_env()
        result = subprocess.run(
            [find_go(), "build", "-ldflags", "-s -w", "-o", str(rootfs / "pause"), "."],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise AssetError(f"building the pause image's binary failed:\n{result.stderr[-1500:]}")
        os.chmod(rootfs / "pause", 0o755)
        layer = Path(tmp, "layer.tar")
        oci.write_layer(rootfs, layer)
        partial = out.with_suffix(".tar.partial")
        oci.write_archive(partial, PAUSE_IMAGE, [layer], oci.ImageConfig(entrypoint=["/pause"], user="65535:65535"))
        partial.replace(out)
    log(f"built the pause image {PAUSE_IMAGE} ({out})")
