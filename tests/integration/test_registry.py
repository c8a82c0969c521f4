"""The development registry (hack/controlplane/registry.py): a real CNCF Distribution over TLS with htpasswd, an
OCI image pushed to it through the distribution API, and the chart pushed as an OCI artifact by a real helm.

The image here is a small one made by the same OCI writer as `make image` (the 1 GiB project image is pushed by
the e2e suite); everything else is what the development cluster runs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.controlplane import oci, pki, registry
from hack.controlplane.errors import AssetError
from hack.helm import provide as provide_helm

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "metainfer"
USER = registry.Credentials("metainfer", "pull and push")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[registry.RegistryServer]:
    try:
        binary = registry.provide(lambda message: print(message, file=sys.__stderr__))
    except AssetError as exc:
        pytest.fail(f"cannot provide the registry {registry.REGISTRY_VERSION}: {exc}", pytrace=False)
    work = tmp_path_factory.mktemp("registry")
    keys = pki.generate(work / "pki")
    started = registry.RegistryServer(binary, work / "server", keys.serving_cert, keys.serving_key, keys.ca_cert, USER)
    started.start()
    try:
        yield started
    finally:
        started.stop()


def _image(tmp_path: Path, marker: str) -> Path:
    """Two layers, as `make image` stacks them: a base every image here shares, and a step's changes above it."""
    root = tmp_path / f"rootfs-{marker}"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text("the same base in every image")
    base = tmp_path / f"base-{marker}.tar"
    oci.write_layer(root, base)
    before = oci.snapshot(root)
    (root / "etc" / "marker").write_text(marker)
    step = tmp_path / f"step-{marker}.tar"
    oci.write_diff_layer(root, before, step)
    archive = tmp_path / f"image-{marker}.oci.tar"
    config = oci.ImageConfig(entrypoint=["/bin/true"])
    oci.write_archive(archive, f"metainfer.local/probe:{marker}", [base, step], config)
    return archive


def test_nothing_is_served_without_credentials(server: registry.RegistryServer) -> None:
    assert registry.manifest_digest(server.address, "metainfer", "0.1.0", None, server.ca) == "HTTP 401"
    wrong = registry.Credentials(USER.username, "not the password")
    assert registry.manifest_digest(server.address, "metainfer", "0.1.0", wrong, server.ca) == "HTTP 401"


def test_a_pushed_image_is_served_by_tag_and_by_digest_and_a_push_sends_only_the_layers_it_lacks(
    server: registry.RegistryServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _image(tmp_path, "one")
    digest = registry.push_archive(archive, server.address, "probe", "one", USER, server.ca)
    assert digest.startswith("sha256:")
    assert registry.manifest_digest(server.address, "probe", "one", USER, server.ca) == digest
    assert registry.manifest_digest(server.address, "probe", digest, USER, server.ca) == digest
    assert registry.manifest_digest(server.address, "probe", digest, None, server.ca) == "HTTP 401"

    sent: list[str] = []
    real = registry._request

    def counting(address: str, ca: Path, method: str, path: str, *args: object, **kwargs: object) -> object:
        if method == "PUT" and "/blobs/" in path:
            sent.append(path)
        return real(address, ca, method, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(registry, "_request", counting)
    assert registry.push_archive(archive, server.address, "probe", "again", USER, server.ca) == digest
    assert sent == [], "blobs the registry holds were uploaded again"
    other = registry.push_archive(_image(tmp_path, "two"), server.address, "probe", "two", USER, server.ca)
    assert other != digest and len(sent) == 2  # the step's new layer and a new config; not the shared base


def test_the_chart_is_pushed_and_read_back_as_an_oci_artifact(server: registry.RegistryServer, tmp_path: Path) -> None:
    try:
        helm = str(provide_helm(lambda message: print(message, file=sys.__stderr__)))
    except AssetError as exc:
        pytest.fail(f"cannot provide helm: {exc}", pytrace=False)
    env = {"HELM_CONFIG_HOME": str(tmp_path / "helm-config"), "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
           "HELM_DATA_HOME": str(tmp_path / "helm-data"), "PATH": "/usr/bin:/bin"}  # fmt: skip
    auth = ["--ca-file", str(server.ca), "--username", USER.username, "--password", USER.password]

    def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=120, check=False)

    packaged = run_helm("package", str(CHART), "--destination", str(tmp_path))
    assert packaged.returncode == 0, packaged.stderr
    (package,) = tmp_path.glob("metainfer-*.tgz")
    anonymous = run_helm("push", str(package), f"oci://{server.address}/charts", "--ca-file", str(server.ca))
    assert anonymous.returncode != 0, "the registry took a chart from an anonymous client"
    pushed = run_helm("push", str(package), f"oci://{server.address}/charts", *auth)
    assert pushed.returncode == 0, pushed.stderr
    digest = next(line.split()[-1] for line in (pushed.stdout + pushed.stderr).splitlines() if "Digest:" in line)
    version = package.name.removeprefix("metainfer-").removesuffix(".tgz")
    shown = run_helm("show", "chart", f"oci://{server.address}/charts/metainfer", "--version", version, *auth)
    assert shown.returncode == 0, shown.stderr
    assert "name: metainfer" in shown.stdout and f"version: {version}" in shown.stdout
    assert registry.manifest_digest(server.address, "charts/metainfer", version, USER, server.ca) == digest


def test_the_cluster_registry_is_saved_for_its_owner_only_and_pushes_the_chart(
    server: registry.RegistryServer, tmp_path: Path
) -> None:
    """What `make cluster-up` saves for `make image`: the password never readable by others; the chart pushed
    from it is the artifact the registry then serves."""
    try:
        helm = provide_helm(lambda message: print(message, file=sys.__stderr__))
    except AssetError as exc:
        pytest.fail(f"cannot provide helm: {exc}", pytrace=False)
    found = registry.ClusterRegistry(server.address, server.ca, USER)
    found.save(tmp_path)
    assert (tmp_path / registry.CLUSTER_REGISTRY_FILE).stat().st_mode & 0o077 == 0
    assert registry.ClusterRegistry.load(tmp_path) == found
    assert registry.ClusterRegistry.load(tmp_path / "elsewhere") is None
    reference, version, digest = found.push_chart(helm, CHART, tmp_path / "helm")
    assert reference == f"oci://{server.address}/charts/metainfer"
    assert registry.manifest_digest(server.address, "charts/metainfer", version, USER, server.ca) == digest
