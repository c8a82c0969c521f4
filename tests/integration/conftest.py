"""A real kube-apiserver + etcd (+ kube-controller-manager) for the whole test session.

One control plane per session keeps the suite fast (start ~ seconds once the
binaries are cached); isolation comes from one namespace per test, and from
Nodes labelled for that test (``nodes``). The binaries come from
KUBEBUILDER_ASSETS or are built and cached by hack.controlplane; when that
fails the session fails with the reason: an integration test that silently
skips proves nothing. The same holds for Prometheus (``prometheus``).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from operator_harness import Nodes

from hack.controlplane import assets, crds, launch
from hack.controlplane.errors import ControlPlaneError
from hack.prometheus import PrometheusServer, PrometheusUnavailable, find_binary
from metainfer.agent.zoo import ExampleModel, build_examples

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ControlPlaneHandle:
    """What a test needs to talk to the session's control plane."""

    plane: launch.ControlPlane
    api_client: client.ApiClient
    kubectl_path: Path

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def server(self) -> str:
        return self.plane.server

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane; on ``check`` failure the error shows stderr."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        result = subprocess.run(
            [str(self.kubectl_path), *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result


def _reporter(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Print progress (a cold build takes many minutes) past pytest's output capture."""
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")

    def log(message: str) -> None:
        if terminal is not None:
            terminal.write_line(f"[controlplane] {message}")
        else:
            print(f"[controlplane] {message}", file=sys.__stderr__, flush=True)

    return log


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlaneHandle]:
    log = _reporter(request)
    try:
        found = assets.provide(log)
        kubectl_path = assets.find_kubectl(log)
    except ControlPlaneError as exc:
        pytest.fail(f"cannot provide kube-apiserver/etcd for integration tests: {exc}", pytrace=False)
    documents = crds.load_crds((REPO / "crds").glob("*.yaml"))
    if not documents:
        pytest.fail(f"no CRDs in {REPO / 'crds'}: run `python -m metainfer.core.api.crdgen crds/`", pytrace=False)
    # die_with_parent: even a SIGKILLed pytest leaves no daemon behind.
    plane = launch.start(
        tmp_path_factory.mktemp("controlplane"), found, log=log, die_with_parent=True, crd_documents=documents
    )
    api_client: client.ApiClient | None = None
    try:
        api_client = config.new_client_from_config(config_file=str(plane.kubeconfig))
        yield ControlPlaneHandle(plane=plane, api_client=api_client, kubectl_path=kubectl_path)
    finally:
        if api_client is not None:
            api_client.close()
        plane.stop()


@pytest.fixture
def namespace(control_plane: ControlPlaneHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (kube-controller-manager empties it)."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"t-{slug}-{secrets.token_hex(3)}"
    core = client.CoreV1Api(control_plane.api_client)
    core.create_namespace({"metadata": {"name": name, "labels": {"metainfer.io/test": "true"}}})
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def nodes(control_plane: ControlPlaneHandle, namespace: str) -> Iterator[Nodes]:
    """Add Nodes with ``nodes.add(features)``; they are deleted after the test."""
    created = Nodes(control_plane.api_client, namespace)
    try:
        yield created
    finally:
        created.delete_all()


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    try:
        return find_binary(lambda m: print(m, file=sys.__stderr__))
    except PrometheusUnavailable as exc:
        pytest.fail(f"drift and canary tests need a real Prometheus: {exc}", pytrace=False)


@pytest.fixture
def prometheus(
    prometheus_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[list[str]], PrometheusServer]]:
    """``prometheus(targets)`` starts a Prometheus scraping ``targets`` every second and points the operators this
    test starts at it (METAINFER_PROMETHEUS_URL); it is stopped after the test."""
    started: list[PrometheusServer] = []

    def start(targets: list[str]) -> PrometheusServer:
        server = PrometheusServer(prometheus_binary, tmp_path / f"prometheus-{len(started)}", targets, 1.0)
        started.append(server)
        server.start()
        monkeypatch.setenv("METAINFER_PROMETHEUS_URL", server.url)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> ExampleModel:
    """The digits example model and its data, built by code (what the serving tests serve)."""
    return build_examples(tmp_path_factory.mktemp("examples"), ["digits"])["digits"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> ExampleModel:
    """The bert_mini example: an encoder that takes token ids (the serving tests' bad ids and chaos)."""
    return build_examples(tmp_path_factory.mktemp("examples"), ["bert_mini"])["bert_mini"]


@pytest.fixture(scope="module")
def digits_file(example: ExampleModel) -> tuple[Path, str]:
    """The digits example as a policy names it: its model file (``file://`` URI) and that file's sha256. (``digits``,
    tests/conftest.py's, is the same model loaded: bytes, ModelInfo and data.)"""
    return example.model_path, example.sha256
