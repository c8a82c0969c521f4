"""The committed KServe v2 gRPC definition: compiled as grpcio-tools compiles it, the wire format of real clients."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

from grpc_tools import protoc
from tritonclient.grpc import service_pb2

from metainfer.agent.serve import grpc_messages as pb

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "agent" / "serve" / "kserve_v2"
SERVED = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")


def test_the_descriptor_set_is_what_grpcio_tools_compiles_from_the_proto(tmp_path: Path) -> None:
    out = tmp_path / "grpc_predict_v2.binpb"
    args = ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", str(PROTO_DIR / pb.PROTO)]
    assert protoc.main(args) == 0
    assert out.read_bytes() == pb.DESCRIPTOR_SET.read_bytes(), (
        "agent/serve/kserve_v2/grpc_predict_v2.binpb is stale: regenerate it as agent/serve/grpc_messages.py says"
    )


def test_the_service_and_its_messages_are_the_ones_tritonclient_calls() -> None:
    """Same service path, same request and response types (Triton's file is a superset of KServe's)."""
    ours = pb.FILE.services_by_name["GRPCInferenceService"]
    theirs = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == pb.SERVICE
    for name in SERVED:
        mine, triton = ours.methods_by_name[name], theirs.methods_by_name[name]
        assert (mine.input_type.full_name, mine.output_type.full_name) == (
            triton.input_type.full_name,
            triton.output_type.full_name,
        )
        assert not mine.client_streaming and not mine.server_streaming


def test_a_tritonclient_request_reads_field_for_field_and_our_response_reads_back() -> None:
    request = service_pb2.ModelInferRequest(model_name="m", model_version="1", id="r", raw_input_contents=[b"\0" * 8])
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([0.5, -1.5])
    tensor.parameters["priority"].int64_param = 3
    request.outputs.add(name="y")
    parsed = pb.ModelInferRequest.FromString(request.SerializeToString())
    assert (parsed.model_name, parsed.model_version, parsed.id) == ("m", "1", "r")
    assert parsed.raw_input_contents == [b"\0" * 8] and [o.name for o in parsed.outputs] == ["y"]
    (mine,) = parsed.inputs
    assert (mine.name, mine.datatype, list(mine.shape)) == ("x", "FP32", [1, 2])
    assert list(mine.contents.fp32_contents) == [0.5, -1.5] and mine.parameters["priority"].int64_param == 3

    response = pb.ModelInferResponse(model_name="m", model_version="1", id="r", raw_output_contents=[b"\1\2"])
    response.outputs.add(name="y", datatype="INT8", shape=[2])
    back = service_pb2.ModelInferResponse.FromString(response.SerializeToString())
    assert back.id == "r" and back.raw_output_contents == [b"\1\2"]
    assert (back.outputs[0].name, back.outputs[0].datatype, list(back.outputs[0].shape)) == ("y", "INT8", [2])


def test_the_proto_and_the_descriptor_set_ship_in_the_wheel() -> None:
    """The server builds its messages from the descriptor set at import: a wheel without it cannot serve gRPC."""
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = package_data["metainfer.agent.serve.kserve_v2"]
    for name in (pb.PROTO, "grpc_predict_v2.binpb"):
        assert any(fnmatch(name, pattern) for pattern in patterns), name
