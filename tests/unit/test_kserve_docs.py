"""docs/kserve.md: its YAML is what KServe accepts, and the container it describes is a `metainfer serve` that starts.

No KServe here, so the checks are the fields KServe's CRDs and controller require (apiVersion and kind, a model
format the runtime supports, a protocol version it declares, the predictor container KServe merges the model into,
one named port as Knative allows) and the arguments KServe would hand the container: the runtime's, then the
InferenceService's, with ``{{.Name}}`` filled in, parsed and checked by `metainfer serve`'s own code.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from metainfer.agent.serve.command import config_from_args
from metainfer.agent.serve.flags import add_arguments

DOC = Path(__file__).resolve().parents[2] / "docs" / "kserve.md"
RUNTIME_KINDS = {"ServingRuntime", "ClusterServingRuntime"}
PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
KNATIVE_PORT_NAMES = {"v2": "http1", "grpc-v2": "h2c"}  # how Knative tells HTTP/1.1 from HTTP/2 (gRPC)
STORAGE_MOUNT = "/mnt/models/"  # where KServe's storage initializer puts storageUri


def _documents() -> list[dict[str, Any]]:
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc is not None]


DOCUMENTS = _documents()
RUNTIMES = {doc["metadata"]["name"]: doc for doc in DOCUMENTS if doc["kind"] in RUNTIME_KINDS}
SERVICES = [doc for doc in DOCUMENTS if doc["kind"] == "InferenceService"]


def test_the_page_has_runtimes_for_both_protocols_and_services_using_them() -> None:
    assert {doc["kind"] for doc in DOCUMENTS} <= RUNTIME_KINDS | {"InferenceService"}
    protocols = {p for runtime in RUNTIMES.values() for p in runtime["spec"]["protocolVersions"]}
    assert protocols == {"v2", "grpc-v2"}
    assert {isvc["spec"]["predictor"]["model"]["runtime"] for isvc in SERVICES} == set(RUNTIMES)


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_a_runtime_carries_what_kserve_requires(name: str) -> None:
    runtime = RUNTIMES[name]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    spec = runtime["spec"]
    assert spec["supportedModelFormats"] and all(f["name"] for f in spec["supportedModelFormats"])
    assert set(spec["protocolVersions"]) <= PROTOCOLS
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"  # the container KServe merges the InferenceService's model into
    assert container["command"] == ["metainfer"] and container["args"][0] == "serve"
    (port,) = container["ports"]  # Knative serves one port per container
    (protocol,) = spec["protocolVersions"]
    assert port["name"] == KNATIVE_PORT_NAMES[protocol] and port["protocol"] == "TCP"
    probe = container["readinessProbe"]
    assert (probe.get("httpGet") or probe.get("tcpSocket"))["port"] == port["containerPort"]  # Knative's rule
    mounts = {m["name"] for m in container.get("volumeMounts", [])}
    assert mounts <= {v["name"] for v in spec.get("volumes", [])}


@pytest.mark.parametrize("index", range(len(SERVICES)))
def test_an_inference_service_starts_a_serve_that_listens_on_the_routed_port(index: int) -> None:
    isvc = SERVICES[index]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    model = isvc["spec"]["predictor"]["model"]
    runtime = RUNTIMES[model["runtime"]]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    (container,) = runtime["spec"]["containers"]
    # What KServe runs: the runtime's args, then the InferenceService's, with the template filled in.
    argv = [arg.replace("{{.Name}}", isvc["metadata"]["name"]) for arg in container["args"] + model["args"]]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv[1:])
    config = config_from_args(args)  # the recipe parses, every bound is valid
    grpc_port = config.grpc_port
    assert config.model_name == isvc["metadata"]["name"]
    assert re.fullmatch(r"[0-9a-f]{64}", args.model_sha256)
    assert args.model_uri.startswith("file://" + STORAGE_MOUNT) and model["storageUri"]
    (port,) = container["ports"]
    routed = config.port if model["protocolVersion"] == "v2" else grpc_port
    assert port["containerPort"] == routed
