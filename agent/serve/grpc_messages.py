"""The KServe v2 gRPC messages of ``kserve_v2/grpc_predict_v2.proto``, built in a descriptor pool of our own.

The messages come from the descriptor set that grpcio-tools compiles from the committed .proto
(``kserve_v2/grpc_predict_v2.binpb``), not from generated ``*_pb2.py`` modules. Generated modules register their
messages in protobuf's process-wide default pool, and tritonclient.grpc and kserve register the same full names
(``inference.ModelInferRequest``, ...) from their own copies of the file: two of them in one process fail at import
with "duplicate symbol 'inference.ServerLiveRequest'". A pool of our own keeps this module importable beside any
client library (the test session, which imports tritonclient.grpc, is such a process; so is a benchmark that drives
the server with it). The wire format does not change: protobuf sends field numbers, never names.

After editing the .proto, regenerate the descriptor set (grpcio-tools is a dev dependency; its output is the same
bytes for the same .proto, and tests/unit/test_serve_grpc_messages.py fails while the committed one is stale):

    .venv/bin/python -m grpc_tools.protoc -I agent/serve/kserve_v2 \\
        --descriptor_set_out=agent/serve/kserve_v2/grpc_predict_v2.binpb agent/serve/kserve_v2/grpc_predict_v2.proto
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO = "grpc_predict_v2.proto"
SERVICE = "inference.GRPCInferenceService"
SOURCE = files("metainfer.agent.serve.kserve_v2").joinpath(PROTO)
DESCRIPTOR_SET = files("metainfer.agent.serve.kserve_v2").joinpath("grpc_predict_v2.binpb")


_POOL = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes()).file:
    _POOL.Add(_file)
FILE = _POOL.FindFileByName(PROTO)
_CLASSES = message_factory.GetMessageClassesForFiles([PROTO], _POOL)
ServerLiveRequest: Any = _CLASSES["inference.ServerLiveRequest"]
ServerLiveResponse: Any = _CLASSES["inference.ServerLiveResponse"]
ServerReadyRequest: Any = _CLASSES["inference.ServerReadyRequest"]
ServerReadyResponse: Any = _CLASSES["inference.ServerReadyResponse"]
ModelReadyRequest: Any = _CLASSES["inference.ModelReadyRequest"]
ModelReadyResponse: Any = _CLASSES["inference.ModelReadyResponse"]
ServerMetadataRequest: Any = _CLASSES["inference.ServerMetadataRequest"]
ServerMetadataResponse: Any = _CLASSES["inference.ServerMetadataResponse"]
ModelMetadataRequest: Any = _CLASSES["inference.ModelMetadataRequest"]
ModelMetadataResponse: Any = _CLASSES["inference.ModelMetadataResponse"]
ModelInferRequest: Any = _CLASSES["inference.ModelInferRequest"]
ModelInferResponse: Any = _CLASSES["inference.ModelInferResponse"]
