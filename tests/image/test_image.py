"""The registry-less image (`make image`) is the image the Dockerfile describes, in every runtime flavour.

No Docker engine runs here, so the Dockerfile path cannot be built in a test;
what can be checked is that both paths meet on everything the issue names:
the entrypoint, user, working directory and environment the Dockerfile
declares (read here with plain regular expressions, not with the builder's own
parser), the Python minor version, and the packages: exactly the pins of
locks/<flavour>.txt, from wheels whose hashes that lock names. Each flavour's
entrypoint is run as its user (``metainfer runtime --providers``, by the build):
its ONNX Runtime must offer the execution providers the flavour is for.

Its own tier (needs root, no cluster): `make test` runs it beside the e2e tier, which then finds every image it
pushes already built (hack/image/build.py lets one build run at a time).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from hack import lock
from hack.controlplane import oci
from hack.image import build

REPO = Path(__file__).resolve().parents[2]
SITE = "opt/metainfer/lib/python3.11/site-packages/"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The execution providers each flavour's ONNX Runtime must offer (locks/<flavour>.txt names its build).
FLAVOUR_PROVIDERS = {
    "cpu": {"CPUExecutionProvider"},
    "cuda": {"CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"},
    "openvino": {"OpenVINOExecutionProvider", "CPUExecutionProvider"},
}


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the image is built in a chroot over bind mounts, which needs root; CI runs as root")


@pytest.fixture(scope="module", params=sorted(FLAVOUR_PROVIDERS))
def image(request: pytest.FixtureRequest) -> build.BuiltImage:
    require_root()
    return build.build(build_args={"RUNTIME": request.param})


def _flavour(image: build.BuiltImage) -> str:
    tag = image.name.rsplit(":", 1)[1]
    return tag.split("-", 1)[1] if "-" in tag else "cpu"


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


def test_the_image_installs_exactly_the_locks_wheels(image: build.BuiltImage) -> None:
    """Every installed distribution is the flavour lock's pin (and nothing else is installed), and every wheel the
    build installed from is one of the lock's hashes: two builds of one commit install byte-identical wheels."""
    python_version = re.search(r"^ARG PYTHON_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)[1]  # type: ignore[index]
    installed: dict[str, str] = {}
    names = [name for _, layer in _layers(image) for name in layer]
    for name in names:
        match = re.fullmatch(re.escape(SITE) + r"([^/]+)-([^-/]+)\.dist-info", name)
        if match:
            installed[_normalize(match[1])] = match[2]
    assert f"usr/bin/python{python_version}" in names, f"the base's python3 is not the Dockerfile's {python_version}"
    flavour_lock = REPO / "locks" / f"{_flavour(image)}.txt"
    pinned = lock.pins(flavour_lock.read_text())
    seeded_by_venv = {"pip", "setuptools"}
    assert {k: v for k, v in installed.items() if k not in seeded_by_venv} == {
        "metainfer": build.project_version(),
        **{name: version for name, (version, _) in pinned.items()},
    }
    wheelhouse = build.lock_wheelhouse(flavour_lock, build.cache_root() / "image" / "work")
    wheels = sorted(wheelhouse.glob("*.whl"))
    assert len(wheels) == len(pinned)
    for wheel in wheels:
        name = _normalize(wheel.name.split("-")[0])
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() in pinned[name][1], wheel.name


def _layers(image: build.BuiltImage) -> list[tuple[int, list[str]]]:
    """The size and the paths of each layer of the image, lowest layer first."""
    layers: list[tuple[int, list[str]]] = []
    with tarfile.open(image.archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(outer.extractfile("blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]))  # type: ignore[arg-type]
        for descriptor in manifest["layers"]:
            layer = outer.extractfile("blobs/sha256/" + descriptor["digest"].split(":")[1])
            with tarfile.open(fileobj=layer, mode="r|") as rootfs:
                layers.append((descriptor["size"], [m.name for m in rootfs]))
    return layers


def test_the_project_is_a_small_layer_of_its_own_above_the_dependencies(image: build.BuiltImage) -> None:
    """A new commit changes only the top layer: a registry or node holding the previous version gets only it."""
    (_, base), (dependencies_size, dependencies), (project_size, project) = _layers(image)
    assert "usr/bin/python3" in base and not any(n.startswith("opt/metainfer") for n in base)
    assert any(n.startswith(SITE + "onnxruntime") for n in dependencies)
    assert not any(n.startswith((SITE + "metainfer", "opt/metainfer/bin/metainfer")) for n in dependencies)
    assert SITE + "metainfer/agent/cli.py" in project and "opt/metainfer/bin/metainfer" in project
    assert all(n in {"opt", "tmp"} or n.startswith("opt/metainfer") for n in project), sorted(project)[:20]
    assert not [n for n in project if n.startswith(SITE) and ".dist-info" in n and "metainfer-" not in n]
    assert project_size < 32 * 2**20 < dependencies_size, (project_size, dependencies_size)


def test_the_entrypoint_runs_as_the_images_user_and_offers_the_flavours_providers(image: build.BuiltImage) -> None:
    flavour = _flavour(image)
    assert FLAVOUR_PROVIDERS[flavour] <= set(image.providers), (flavour, image.providers)
    runtime_line = lock.pins((REPO / "locks" / f"{flavour}.txt").read_text())
    distribution = {"cpu": "onnxruntime", "cuda": "onnxruntime-gpu", "openvino": "onnxruntime-openvino"}[flavour]
    assert image.runtime.startswith(f"{distribution} {runtime_line[distribution][0]}"), image.runtime
    assert image.providers["CPUExecutionProvider"] is None
    if flavour == "cuda" and not Path("/dev/nvidia0").exists():
        # No GPU and no driver on this host: the CUDA EP loads the image's CUDA and cuDNN wheels and then stops at
        # the driver's own library, which only a GPU node's container runtime provides. (Before the image preloaded
        # its nvidia-* wheels it stopped at libcublasLt.so.13, on GPU nodes too.) TensorRT's libraries are not in
        # the image: NVIDIA publishes them on its own package index only (docs/real-cluster.md).
        assert "libcuda.so.1: cannot open shared object file" in str(image.providers["CUDAExecutionProvider"])
        assert "libnvinfer.so" in str(image.providers["TensorrtExecutionProvider"])


def test_another_onnxruntime_release_is_the_same_project_on_that_runtime() -> None:
    """The image a chart upgrade that changes the runtime brings (tests/e2e): the cpu flavour's Dockerfile and
    project on OTHER_ONNXRUNTIME, from a lock derived with that wheel's hash, under a tag of its own."""
    require_root()
    cpu = build.build()
    other = build.build(onnxruntime=build.OTHER_ONNXRUNTIME)
    assert other.name == f"{cpu.name}-cpu-onnxruntime{build.OTHER_ONNXRUNTIME}"
    assert other.runtime.startswith(f"onnxruntime {build.OTHER_ONNXRUNTIME}+"), other.runtime
    assert other.runtime != cpu.runtime and other.manifest_digest != cpu.manifest_digest
    assert set(other.providers) == set(cpu.providers), (other.providers, cpu.providers)
    assert oci.read_config(other.archive) == oci.read_config(cpu.archive)
