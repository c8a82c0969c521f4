"""The registry-less image (`make image`) is the image the Dockerfile describes.

No Docker engine runs here, so the Dockerfile path cannot be built in a test;
what can be checked is that both paths meet on everything the issue names:
the entrypoint, user, working directory and environment the Dockerfile
declares (read here with plain regular expressions, not with the builder's own
parser), the Python minor version, and the package versions pip resolves for
the same wheel (what `pip install /dist/metainfer-*.whl` in the Dockerfile
installs today).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from platform_harness import require_root

from hack.controlplane import oci
from hack.image import build

REPO = Path(__file__).resolve().parents[2]
SITE = "opt/metainfer/lib/python3.11/site-packages/"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def image() -> build.BuiltImage:
    require_root()
    return build.build()


def test_the_image_config_is_what_the_dockerfile_declares(image: build.BuiltImage) -> None:
    text = (REPO / "Dockerfile").read_text()
    runtime = text[text.rindex("\nFROM ") :]
    config = oci.read_config(image.archive)
    assert config["Entrypoint"] == json.loads(re.search(r"^ENTRYPOINT (.+)$", runtime, re.M)[1])  # type: ignore[index]
    assert config["Cmd"] == json.loads(re.search(r"^CMD (.+)$", runtime, re.M)[1])  # type: ignore[index]
    assert config["User"] == re.search(r"^USER (\S+)$", runtime, re.M)[1]  # type: ignore[index]
    assert config["WorkingDir"] == re.search(r"^WORKDIR (\S+)$", runtime, re.M)[1]  # type: ignore[index]
    env = dict(item.split("=", 1) for item in config["Env"])
    declared = dict(re.findall(r"(?:ENV\s+|\\\n\s+)([A-Z_]+)=(\S+)", runtime))
    for key, value in declared.items():
        if "$" in value:
            assert env[key].startswith(value.split("$")[0].rstrip(":")), (key, env[key], value)
        else:
            assert env[key] == value, key
    assert env["PATH"].startswith("/opt/metainfer/bin:/usr/local/sbin:")
    ports = re.search(r"^EXPOSE (.+)$", runtime, re.M)[1].split()  # type: ignore[index]
    assert sorted(config["ExposedPorts"]) == sorted(f"{p}/tcp" for p in ports)


def test_the_image_installs_the_packages_pip_resolves_for_the_dockerfiles_python(image: build.BuiltImage) -> None:
    python_version = re.search(r"^ARG PYTHON_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)[1]  # type: ignore[index]
    installed: dict[str, str] = {}
    with tarfile.open(image.archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(outer.extractfile("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))  # type: ignore[arg-type]
        layer = outer.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1])
        with tarfile.open(fileobj=layer, mode="r|") as rootfs:
            names = [m.name for m in rootfs]
    for name in names:
        match = re.fullmatch(re.escape(SITE) + r"([^/]+)-([^-/]+)\.dist-info", name)
        if match:
            installed[_normalize(match[1])] = match[2]
    assert f"usr/bin/python{python_version}" in names, f"the base's python3 is not the Dockerfile's {python_version}"
    (wheel,) = (build.cache_root() / "image" / "work" / "dist").glob("metainfer-*.whl")
    report = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--report", "-",
            "--python-version", python_version, "--only-binary=:all:", "--target", "/nonexistent", str(wheel),
        ],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    resolved = {
        _normalize(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.stdout)["install"]
    }
    seeded_by_venv = {"pip", "setuptools"}
    assert {k: v for k, v in installed.items() if k not in seeded_by_venv} == resolved
