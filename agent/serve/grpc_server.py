"""The KServe v2 gRPC front end: inference.GRPCInferenceService on grpc.aio, in the REST server's process and loop.

It is a second door to the same ``Server``, never a second server: a ModelInfer call is refused (UNAVAILABLE)
while draining, and once its message has arrived and been decoded goes through ``Server.admission()``
(UNAVAILABLE with ``--max-queue`` requests admitted, REST and gRPC together, held until the answer has left),
``Server.run_model()`` (the inference workers, the queue deadline, the queue and compute histograms) and
``protocol``'s checks, and it is counted in the same series as a REST request: ``metainfer_inference_requests_total``,
``metainfer_inference_errors_total`` labelled with the HTTP code REST would have answered (one error ratio covers
both protocols), ``metainfer_inference_latency_seconds``.

The port opens once the variant is loaded, because the message size limit is the REST body limit
(``Server.body_limit``: the largest legal request of this model, ``--max-batch`` and ``--max-dynamic-dim``), which
the model's inputs decide. A message over it is refused here as REST refuses such a body: 413 in the metrics,
RESOURCE_EXHAUSTED with REST's message on the wire. gRPC's own limit sits at twice that (``GRPC_LIMIT_FACTOR``):
gRPC refuses a message past it from its length prefix, before reading it, but tells the handler only that no
message came, which looks exactly like a client that left; the headroom keeps the ordinary oversized request (a
batch too big, a long id) counted as REST counts it, and only a message of more than twice the limit counted as a
client that left. Until the port opens liveness is answered on the REST port, which is what the kubelet probes.

A client that cancels, or whose deadline passes, gets its call ended at once, but the request keeps its admission
slot until the work it started (decode, inference) is over: otherwise cancelling would free slots while the workers
are still busy, and ``--max-queue`` would no longer bound the work.

An answer the client does not take within --write-timeout ends its call (counted as a slow reader), but grpc.aio
cannot reset the stream: gRPC keeps the answer queued until the connection closes. It stays counted in the unsent
budget until then, and ``--grpc-max-connection-age`` is what closes such a connection.

On SIGTERM new calls are still answered for the shutdown delay (``Server.linger``), as REST's requests are, and
ServerReady and ModelReady say ready until the drain, as REST's readiness does; grpc.aio has no way to end an HTTP/2
connection short of stopping, so gRPC clients move when the drain starts (and their calls do not lengthen the
delay). Then ``drain`` refuses new calls (GOAWAY, and UNAVAILABLE for a call that still arrives; clients retry on
another replica), lets the calls in flight finish for at most the drain timeout (also one whose message is still
arriving, as REST does for a body), then cuts the rest; those are counted in
``metainfer_inference_aborted_total{reason="drain_timeout"}`` and turn the exit status into 3, as REST's do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc

from metainfer.agent.serve import grpc_messages as pb
from metainfer.agent.serve import model as model_loader
from metainfer.agent.serve.app import MODEL_VERSION, Server, _version
from metainfer.agent.serve.grpc_protocol import (
    encode_model_infer,
    grpc_code,
    model_metadata_response,
    parse_model_infer,
    parse_request,
)
from metainfer.agent.serve.protocol import ProtocolError, Signature, check_model, model_metadata

log = logging.getLogger("metainfer.serve")
# The grace of gRPC's own stop: past the drain timeout, so that the drain, which counts the calls it cuts, cuts them.
STOP_BACKSTOP_S = 5.0
# Calls in progress (receiving, queued, running, sending) per --max-queue slot: room for the messages still arriving
# beside the admitted ones, and a bound on all of them.
CALLS_PER_SLOT = 4
# gRPC's own message limit, in multiples of the model's: see the module's docstring.
GRPC_LIMIT_FACTOR = 2


class GrpcFrontEnd:
    """inference.GRPCInferenceService over a ``Server``; ``start`` once the model is loaded, ``drain`` on SIGTERM."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.in_flight = 0  # ModelInfer calls being answered
        self.cutting = False  # set when the drain times out: the calls cancelled from then on were cut, not left
        self._grpc: grpc.aio.Server | None = None
        self._limit, self._too_large = 0, ""

    async def start(self, host: str, port: int, signature: Signature) -> int:
        """Listen on ``host:port`` for requests to a model of ``signature``; returns the port (the one chosen when
        ``port`` is 0). Raises RuntimeError when the port cannot be bound."""
        config = self.server.config
        self._limit, self._too_large = self.server.body_limit(signature)
        self._grpc = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self._limit * GRPC_LIMIT_FACTOR),
                ("grpc.so_reuseport", 0),  # a second server on the same port fails to start instead of sharing it
                # gRPC's idle timer re-arms once when it finds activity since it was armed, so a connection closes
                # between one and two periods after its last call (--idle-timeout 15: about 30 s, measured); half
                # the flag keeps the close at or before --idle-timeout, as REST's.
                ("grpc.max_connection_idle_ms", max(1, int(config.idle_timeout_s * 500))),
                # A connection that does not take its answers cannot be cut stream by stream: its age closes it
                # (GOAWAY, then the calls in flight get a request's whole time before the connection is closed),
                # freeing what it held. Clients reconnect on GOAWAY by themselves.
                *_age_options(config.grpc_max_connection_age_s, config.request_timeout_s + config.write_timeout_s),
                # One connection cannot open more calls than the server admits; together with the cap on calls
                # below, streams that send headers and then nothing are bounded without touching admission.
                ("grpc.max_concurrent_streams", config.max_queue),
            ],
            maximum_concurrent_rpcs=config.max_queue * CALLS_PER_SLOT,  # beyond: RESOURCE_EXHAUSTED at once
        )
        self._grpc.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, self._handlers()),))
        bound = self._grpc.add_insecure_port(_address(host, port))
        await self._grpc.start()
        log.info("gRPC listening on %s:%d (messages up to %d bytes)", host, bound, self._limit)
        return bound

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        def unary(behaviour: Any, request: Any, response: Any) -> grpc.RpcMethodHandler[Any, Any]:
            return grpc.unary_unary_rpc_method_handler(
                behaviour, request_deserializer=request.FromString, response_serializer=response.SerializeToString
            )

        return {
            "ServerLive": unary(self.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": unary(self.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": unary(self.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": unary(self.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
            "ModelMetadata": unary(self.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
            # Unary on the wire, but handled as a request stream: the handler starts when the call arrives, as a REST
            # handler starts on the headers, so admission, --body-timeout and the drain see the call while its
            # message is still arriving. Bytes in and out: parsing and serializing run on the codec threads, and a
            # message that does not parse is a counted 400 instead of grpc's own uncounted INTERNAL. Its answer is
            # written as a stream's, so the handler knows when flow control has let it out.
            "ModelInfer": grpc.stream_stream_rpc_method_handler(self.model_infer),
        }

    async def drain(self, timeout: float) -> int:
        """Refuse new calls, wait (bounded) for the calls in flight, cut the rest. Returns how many were cut."""
        if self._grpc is None:
            return 0
        log.info("gRPC: draining %d in-flight call(s) for up to %.0f s", self.in_flight, timeout)
        stopped = asyncio.ensure_future(self._grpc.stop(timeout + STOP_BACKSTOP_S))  # new calls are refused from here
        try:
            await asyncio.wait_for(asyncio.shield(stopped), timeout)
            return 0
        except TimeoutError:
            pass
        # gRPC's stop waits for answers still being sent too; their handlers are done, yet one call at least is cut.
        cut, self.cutting = max(self.in_flight, 1), True
        self.server.metrics.aborted("drain_timeout", cut)
        log.warning("gRPC drain timeout after %.0f s: %d call(s) still in flight are cut", timeout, cut)
        await self._grpc.stop(None)
        await stopped
        return cut

    # -- health and metadata ------------------------------------------------
    async def server_live(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return pb.ServerLiveResponse(live=self.server.health().live)

    async def server_ready(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return pb.ServerReadyResponse(ready=self.server.ready)

    async def model_ready(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            check_model(request.name, request.version, self.server.config.model_name, MODEL_VERSION)
        except ProtocolError as exc:
            await _abort(context, exc)
        return pb.ModelReadyResponse(ready=self.server.ready)

    async def server_metadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        # REST's binary_tensor_data is an HTTP extension; over gRPC tensors are binary anyway.
        return pb.ServerMetadataResponse(name="metainfer", version=_version(), extensions=[])

    async def model_metadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            model = self._loaded(request.name, request.version)
        except ProtocolError as exc:
            await _abort(context, exc)
        doc = model_metadata(self.server.config.model_name, [MODEL_VERSION], model.signature)
        return model_metadata_response(doc)

    # -- inference ----------------------------------------------------------
    async def model_infer(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        metrics = self.server.metrics
        metrics.requests.inc()
        received = time.perf_counter()
        self.in_flight += 1
        try:
            work = asyncio.ensure_future(self._infer(requests, context, received))
            try:
                await asyncio.shield(work)  # a cancelled call leaves its work running, admission held
            except asyncio.CancelledError:
                work.add_done_callback(_forget)
                if not self.cutting:
                    metrics.aborted("client_disconnect")
                    metrics.error(499)
                raise
            except _NoMessage as exc:  # the same outcome as the cancellation above, when the end of input won the race
                metrics.aborted("client_disconnect")
                error = ProtocolError(str(exc), 499)
            except _SlowReader:
                # No status can follow a message flow control holds back (grpc refuses the batch): the call ends
                # without one, and gRPC cancels it (RST_STREAM), dropping the unsent answer, once the handler is gone.
                metrics.aborted("slow_reader")
                metrics.error(499)
                raise asyncio.CancelledError from None
            except ProtocolError as exc:
                error = exc
            except Exception as exc:  # the server never dies on a request
                log.exception("unhandled error in gRPC ModelInfer")
                error = ProtocolError(f"internal error ({type(exc).__name__}); see the server log", 500)
            else:
                metrics.latency.observe(time.perf_counter() - received)
                return
            metrics.error(error.status)
            await _abort(context, error)
        finally:
            self.in_flight -= 1

    async def _infer(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any], received: float
    ) -> None:
        loop = asyncio.get_running_loop()
        codec = self.server.codec
        self.server.refuse_if_draining()
        # The message is read and decoded before admission, as REST's body is: a call that sends headers and then
        # nothing holds a stream (bounded per connection and by --body-timeout), never a --max-queue slot.
        data = await self._read_message(requests)
        if len(data) > self._limit:
            raise ProtocolError(self._too_large + f" (message of {len(data)} bytes)", 413)
        request = await loop.run_in_executor(codec, parse_request, data)
        del data
        model = self._loaded(request.model_name, request.model_version)
        parsed = await loop.run_in_executor(codec, parse_model_infer, request, model.signature)
        del request
        with self.server.admission():  # held until the answer has left, so the slots bound unsent answers too
            results = await self.server.run_model(model, parsed.inputs, parsed.outputs, received)
            name = self.server.config.model_name
            payload = await loop.run_in_executor(codec, encode_model_infer, name, MODEL_VERSION, parsed, results)
            del results, parsed
            timeout = self.server.config.write_timeout_s
            connection, size = context.peer(), len(payload)
            self.server.unsent_reserve(connection, size)
            # The write completes once HTTP/2 flow control has let the message out, or fails once its stream or
            # connection is gone: until then gRPC holds the message, whatever becomes of this handler, and so
            # does the reservation. (grpc.aio cannot reset one stream from the server: a status waits behind the
            # message. The connection's age limit closes it; see start.)
            write = asyncio.ensure_future(context.write(payload))
            del payload
            write.add_done_callback(lambda done: self._sent(connection, size))
            try:
                await asyncio.wait_for(asyncio.shield(write), timeout)
            except TimeoutError:
                write.add_done_callback(_forget)
                log.warning("cut a gRPC client that did not read its answer within %g s", timeout)
                raise _SlowReader(f"the answer was not read within {timeout:g} s") from None

    def _sent(self, connection: str, size: int) -> None:
        self.server.unsent.release(connection, size)
        self.server.answered_since_trim += 1

    async def _read_message(self, requests: AsyncIterator[bytes]) -> bytes:
        """The call's one request message, refused (408) when it does not arrive within the body timeout."""
        timeout = self.server.config.body_timeout_s
        try:
            return await asyncio.wait_for(anext(aiter(requests)), timeout)
        except StopAsyncIteration:
            raise _NoMessage("the call ended before its request message arrived") from None
        except TimeoutError:
            raise ProtocolError(f"request message not received within {timeout:g} s", 408) from None

    def _loaded(self, name: str, version: str) -> model_loader.LoadedModel:
        check_model(name, version, self.server.config.model_name, MODEL_VERSION)
        if self.server.model is None:
            raise ProtocolError(f"model {name!r} is still loading", 503)
        return self.server.model


class _SlowReader(Exception):
    """The client did not take its answer within --write-timeout (flow control held it back)."""


class _NoMessage(Exception):
    """The call's input ended without a message: the client left, or gRPC refused a message of more than
    ``GRPC_LIMIT_FACTOR`` times the limit. gRPC tells the handler no more than that either way, so both are counted
    as a client that left (499); the client with the oversized message is told RESOURCE_EXHAUSTED by gRPC itself."""


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: ProtocolError) -> NoReturn:
    """End the call with ``error``'s status; Retry-After travels as trailing metadata."""
    trailers = tuple((key.lower(), value) for key, value in error.headers.items() if key == "Retry-After")
    await context.abort(grpc_code(error.status), str(error), trailing_metadata=trailers)


def _forget(task: asyncio.Future[Any]) -> None:
    """The outcome of work whose call was cancelled: nobody waits for it any more."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned gRPC request ended with %r", task.exception())


def _age_options(age_s: float, grace_s: float) -> list[tuple[str, int]]:
    if age_s <= 0:
        return []
    age, grace = int(age_s * 1000), int(grace_s * 1000)
    return [("grpc.max_connection_age_ms", age), ("grpc.max_connection_age_grace_ms", grace)]


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
