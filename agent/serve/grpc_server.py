"""The KServe v2 gRPC front end: inference.GRPCInferenceService on grpc.aio, in the REST server's process and loop.

It is a second door to the same ``DataPlane`` (dataplane.py) as REST's (app.py), never a second server: a
ModelInfer call is refused (UNAVAILABLE) while draining, and once its message has arrived and been decoded goes
through ``DataPlane.admit_waiting()`` (the ``--max-queue`` slots REST and gRPC share, held until the answer has
left; a call that finds them taken waits for one until its deadline, as HTTP/2 flow control once made a burst wait
at the client), ``DataPlane.run_model()`` (the inference workers, the queue deadline, the queue and compute
histograms) and ``protocol``'s checks, and it is counted in the same series as a REST request:
``metainfer_inference_requests_total``, ``metainfer_inference_errors_total`` labelled with the HTTP code REST would
have answered (one error ratio covers both protocols), ``metainfer_inference_latency_seconds``.

The port opens once the variant is loaded, because the message size limit is the REST body limit
(``DataPlane.body_limit``: the largest legal request of this model, ``--max-batch`` and ``--max-dynamic-dim``), which
the model's inputs decide. A message over it is refused here as REST refuses such a body: 413 in the metrics,
RESOURCE_EXHAUSTED with REST's message on the wire. gRPC's own limit sits at twice that (``GRPC_LIMIT_FACTOR``):
gRPC refuses a message past it from its length prefix, before reading it, but tells the handler only that no
message came, which looks exactly like a client that left; the headroom keeps the ordinary oversized request (a
batch too big, a long id) counted as REST counts it, and only a message of more than twice the limit counted as a
client that left. Until the port opens liveness is answered on the REST port, which is what the kubelet probes.

A client that cancels, or whose deadline passes, gets its call ended at once, but an admitted request keeps its
slot until the work it started (inference, encoding) is over: otherwise cancelling would free slots while the
workers are still busy, and ``--max-queue`` would no longer bound the work. That work never touches the call: grpcio
releases a call's core object when its handler ends, and reading its peer (or writing to it) afterwards was a
SIGSEGV that any client with a short deadline could cause. The client's deadline is also the request's: work still
queued when it passes is dropped and the call answered DEADLINE_EXCEEDED.

Calls in progress are bounded by a cap of our own (``CALLS_PER_SLOT`` x ``--max-queue``) and by the bytes of the
messages waiting for a slot (``WAITING_BYTES``); past them a call is refused UNAVAILABLE with ``retry-after`` and
``grpc-retry-pushback-ms`` (the hint gRPC clients with a retry policy obey), counted as a 503. There is no HTTP/2
stream limit: a client opens the streams of a burst before it has read the server's SETTINGS, and gRPC reset every
one over the limit (REFUSED_STREAM, which clients report as UNAVAILABLE with no hint).

An answer the client does not take within --write-timeout ends its call (counted as a slow reader), but grpc.aio
cannot reset the stream: gRPC keeps the answer queued until the connection closes. It stays counted in the unsent
budget until then, and ``--grpc-max-connection-age`` is what closes such a connection.

On SIGTERM new calls are still answered for the shutdown delay (``DataPlane.linger``), as REST's requests are, and
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
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

from metainfer.agent.serve import grpc_messages as pb
from metainfer.agent.serve import model as model_loader
from metainfer.agent.serve.dataplane import MODEL_VERSION, DataPlane, server_version
from metainfer.agent.serve.grpc_protocol import (
    encode_model_infer,
    grpc_code,
    model_metadata_response,
    parse_model_infer,
    parse_request,
)
from metainfer.agent.serve.protocol import InferRequest, ProtocolError, Signature, check_model, model_metadata

log = logging.getLogger("metainfer.serve")
# The grace of gRPC's own stop: past the drain timeout, so that the drain, which counts the calls it cuts, cuts them.
STOP_BACKSTOP_S = 5.0
PUSHBACK = "grpc-retry-pushback-ms"
# Calls in progress (receiving, waiting for admission, queued, running, sending) per --max-queue slot: room for a
# burst to wait for admission (500 calls at once at the default --max-queue 64), and a bound on all of them.
CALLS_PER_SLOT = 16
# The bytes of request messages that may wait for admission at once: what a burst of calls holds before it runs.
WAITING_BYTES = 64 << 20
# gRPC's own message limit, in multiples of the model's: see the module's docstring.
GRPC_LIMIT_FACTOR = 2
# Room in gRPC's own cap on calls for the health and metadata calls beside a full house of ModelInfer calls.
HEALTH_CALLS = 64


class _EndedCallFilter(logging.Filter):
    """grpc.aio logs an ERROR with a traceback when the status of a call that had just ended (its deadline passed,
    its client cancelled) could not be sent after the handler returned: an ordinary client event, not a server
    fault, said in one debug line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("ExecuteBatchError raised in core by servicer method"):
            log.debug("a call ended before its status was sent (its deadline passed or its client cancelled)")
            return False
        return True


logging.getLogger("grpc._cython.cygrpc").addFilter(_EndedCallFilter())


class GrpcFrontEnd:
    """inference.GRPCInferenceService over a ``DataPlane``; ``start`` once the model is loaded, ``drain`` on SIGTERM."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.in_flight = 0  # ModelInfer calls being answered
        self.cutting = False  # set when the drain times out: the calls cancelled from then on were cut, not left
        self._grpc: grpc.aio.Server | None = None
        self._limit, self._too_large = 0, ""
        # ModelInfer calls in progress at once (receiving, queued, running, sending); one more is refused UNAVAILABLE.
        self._max_calls = plane.config.max_queue * CALLS_PER_SLOT
        self._waiting_bytes = 0  # messages of calls read but not yet admitted

    async def start(self, host: str, port: int, signature: Signature) -> int:
        """Listen on ``host:port`` for requests to a model of ``signature``; returns the port (the one chosen when
        ``port`` is 0). Raises RuntimeError when the port cannot be bound."""
        config = self.plane.config
        self._limit, self._too_large = self.plane.body_limit(signature)
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
                # No HTTP/2 MAX_CONCURRENT_STREAMS: a client opens the streams of a burst before it has read the
                # server's SETTINGS, and gRPC resets every stream over the limit (RST_STREAM REFUSED_STREAM), which
                # clients report as UNAVAILABLE with no hint to retry: 354 of a burst of 500 calls on one channel,
                # at --max-queue 64 (measured). Calls are bounded by the cap model_infer applies instead, answered
                # with a status a client can act on.
            ],
            # gRPC's own cap, for every method: a backstop past the ModelInfer cap (``_max_calls``), whose refusal
            # is counted and carries a retry hint, where gRPC's RESOURCE_EXHAUSTED is neither.
            maximum_concurrent_rpcs=2 * self._max_calls + HEALTH_CALLS,
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
        self.plane.metrics.aborted("drain_timeout", cut)
        log.warning("gRPC drain timeout after %.0f s: %d call(s) still in flight are cut", timeout, cut)
        await self._grpc.stop(None)
        await stopped
        return cut

    # -- health and metadata ------------------------------------------------
    async def server_live(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return pb.ServerLiveResponse(live=self.plane.health().live)

    async def server_ready(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return pb.ServerReadyResponse(ready=self.plane.ready)

    async def model_ready(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            check_model(request.name, request.version, self.plane.config.model_name, MODEL_VERSION)
        except ProtocolError as exc:
            await _abort(context, exc)
        return pb.ModelReadyResponse(ready=self.plane.ready)

    async def server_metadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        # REST's binary_tensor_data is an HTTP extension; over gRPC tensors are binary anyway.
        return pb.ServerMetadataResponse(name="metainfer", version=server_version(), extensions=[])

    async def model_metadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            model = self.plane.loaded(request.name, request.version)
        except ProtocolError as exc:
            await _abort(context, exc)
        doc = model_metadata(self.plane.config.model_name, [MODEL_VERSION], model.signature)
        return model_metadata_response(doc)

    # -- inference ----------------------------------------------------------
    async def model_infer(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> None:
        # Everything that touches ``context`` (its peer, the message, the answer, the status) happens in this
        # handler, never in work that outlives it: once the handler has ended, grpcio releases the call's core object
        # and leaves a NULL pointer that ``peer()``, ``read()`` and ``write()`` dereference (a SIGSEGV: clients
        # whose deadlines passed or who cancelled took the server down that way). The work that goes on after a
        # cancelled call (decode, inference, encoding) sees only bytes.
        metrics = self.plane.metrics
        metrics.requests.inc()
        received = time.perf_counter()
        connection = context.peer()
        deadline = _client_deadline(context.time_remaining(), received)
        self.in_flight += 1
        try:
            payload, release = await self._answer(requests, received, deadline)
            try:
                await self._write(context, connection, payload)
            finally:
                release()
        except asyncio.CancelledError:
            if not self.cutting:
                metrics.aborted("client_disconnect")
                metrics.error(499)
            raise
        except _NoMessage as exc:  # the same outcome as a cancellation, when the end of input won the race
            metrics.aborted("client_disconnect")
            await self._refuse(context, ProtocolError(str(exc), 499))
        except _CallGone:  # its deadline passed or it was cancelled in gRPC's core, before the handler heard of it
            metrics.aborted("client_disconnect")
            metrics.error(499)
            raise asyncio.CancelledError from None
        except _SlowReader:
            # No status can follow a message flow control holds back (grpc refuses the batch): the call ends
            # without one, and gRPC cancels it (RST_STREAM), dropping the unsent answer, once the handler is gone.
            metrics.aborted("slow_reader")
            metrics.error(499)
            raise asyncio.CancelledError from None
        except ProtocolError as exc:
            await self._refuse(context, exc)
        except Exception as exc:  # the server never dies on a request
            log.exception("unhandled error in gRPC ModelInfer")
            error = ProtocolError(f"internal error ({type(exc).__name__}); see the server log", 500)
            await self._refuse(context, error)
        else:
            metrics.latency.observe(time.perf_counter() - received)
        finally:
            self.in_flight -= 1
            # Whatever its end (a refusal, a cut, a cancel), a call leaves memory for the idle trim to hand back:
            # counting only the answers that left missed the calls cut or refused (the trim never ran after them).
            self.plane.answered_since_trim += 1

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], error: ProtocolError) -> NoReturn:
        """End the call with ``error`` (counted); a call gRPC's core has ended meanwhile just ends."""
        self.plane.metrics.error(error.status)
        try:
            await _abort(context, error)
        except grpc.aio.AbortError:  # what a successful abort raises, to end the handler
            raise
        except grpc.aio.BaseError:  # ExecuteBatchError: its deadline passed or it was cancelled in the meantime
            raise asyncio.CancelledError from None

    async def _answer(
        self, requests: AsyncIterator[bytes], received: float, deadline: float | None
    ) -> tuple[bytes, Callable[[], None]]:
        """The encoded answer and the release of its admission slot, which the caller holds until the answer has
        left.

        The message is read, decoded and admitted here, in the handler: a call cancelled meanwhile holds nothing.
        A call that finds every --max-queue slot taken waits for one, in arrival order, until its deadline (HTTP/2
        flow control made a burst wait at the client before; see ``start``), bounded by ``_max_calls`` and by the
        bytes of the messages waiting (``WAITING_BYTES``); past those it is refused UNAVAILABLE with a retry hint.
        Once admitted, the run and the encoding are shielded: a cancelled call leaves them running and its slot
        taken until they are over (otherwise cancelling would free slots while the workers are still busy, and
        ``--max-queue`` would no longer bound the work)."""
        if self.in_flight > self._max_calls:
            raise _busy(f"{self.in_flight - 1} calls in progress")
        self.plane.refuse_if_draining()
        # A call that sends headers and then nothing holds a call (bounded by the cap above and by --body-timeout),
        # never a --max-queue slot.
        data = await self._read_message(requests)
        if len(data) > self._limit:
            raise ProtocolError(self._too_large + f" (message of {len(data)} bytes)", 413)
        if self._waiting_bytes + len(data) > WAITING_BYTES:
            raise _busy(f"{self._waiting_bytes} bytes of calls wait for admission")
        loop = asyncio.get_running_loop()
        held = len(data)
        self._waiting_bytes += held
        try:
            request = await loop.run_in_executor(self.plane.codec, parse_request, data)
            del data
            model = self.plane.loaded(request.model_name, request.model_version)
            parsed = await loop.run_in_executor(self.plane.codec, parse_model_infer, request, model.signature)
            del request
            release = await self.plane.admit_waiting(received, deadline)
        finally:
            self._waiting_bytes -= held
        work = asyncio.ensure_future(self._compute(model, parsed, received, deadline, release))
        del parsed
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(_release_abandoned)
            raise

    async def _compute(
        self,
        model: model_loader.LoadedModel,
        parsed: InferRequest,
        received: float,
        deadline: float | None,
        release: Callable[[], None],
    ) -> tuple[bytes, Callable[[], None]]:
        """Run and encode, holding the admission slot ``release`` frees: arrays in, bytes out, and nothing of the
        call's (see ``model_infer``)."""
        loop = asyncio.get_running_loop()
        try:
            results = await self.plane.run_model(model, parsed.inputs, parsed.outputs, received, deadline)
            name = self.plane.config.model_name
            payload = await loop.run_in_executor(
                self.plane.codec, encode_model_infer, name, MODEL_VERSION, parsed, results
            )
        except BaseException:
            release()
            raise
        return payload, release

    async def _write(self, context: grpc.aio.ServicerContext[Any, Any], connection: str, payload: bytes) -> None:
        """Send the answer; a client that does not take it within --write-timeout is cut (``_SlowReader``)."""
        timeout = self.plane.config.write_timeout_s
        size = len(payload)
        self.plane.unsent_reserve(connection, size)
        # The write completes once HTTP/2 flow control has let the message out, or fails once its stream or
        # connection is gone: until then gRPC holds the message, whatever becomes of this handler, and so does the
        # reservation. (grpc.aio cannot reset one stream from the server: a status waits behind the message. The
        # connection's age limit closes it; see start.) The write starts before this handler can end: its batch
        # is in gRPC's core before the call's object is released.
        write = asyncio.ensure_future(context.write(payload))
        del payload
        write.add_done_callback(lambda done: self._sent(connection, size))
        write.add_done_callback(_forget)  # its failure is read here even when this handler was cancelled first
        try:
            await asyncio.wait_for(asyncio.shield(write), timeout)
        except grpc.aio.BaseError:  # grpc's core refused the message: the call has ended (ExecuteBatchError)
            raise _CallGone from None
        except TimeoutError:
            log.warning("cut a gRPC client that did not read its answer within %g s", timeout)
            raise _SlowReader(f"the answer was not read within {timeout:g} s") from None

    def _sent(self, connection: str, size: int) -> None:
        self.plane.unsent.release(connection, size)
        self.plane.answered_since_trim += 1

    async def _read_message(self, requests: AsyncIterator[bytes]) -> bytes:
        """The call's one request message, refused (408) when it does not arrive within the body timeout."""
        timeout = self.plane.config.body_timeout_s
        try:
            return await asyncio.wait_for(anext(aiter(requests)), timeout)
        except StopAsyncIteration:
            raise _NoMessage("the call ended before its request message arrived") from None
        except TimeoutError:
            raise ProtocolError(f"request message not received within {timeout:g} s", 408) from None


class _SlowReader(Exception):
    """The client did not take its answer within --write-timeout (flow control held it back)."""


class _CallGone(Exception):
    """gRPC's core ended the call (its deadline, a cancel) before the handler was told: nothing can be sent."""


class _NoMessage(Exception):
    """The call's input ended without a message: the client left, or gRPC refused a message of more than
    ``GRPC_LIMIT_FACTOR`` times the limit. gRPC tells the handler no more than that either way, so both are counted
    as a client that left (499); the client with the oversized message is told RESOURCE_EXHAUSTED by gRPC itself."""


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: ProtocolError) -> NoReturn:
    """End the call with ``error``'s status; Retry-After travels as trailing metadata, beside gRPC's own retry
    hint (``grpc-retry-pushback-ms``, which gRPC clients with a retry policy obey)."""
    await context.abort(grpc_code(error.status), str(error), trailing_metadata=retry_trailers(error.headers))


def retry_trailers(headers: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that says when to retry: REST's Retry-After (seconds) and its pushback in ms."""
    after = headers.get("Retry-After")
    if after is None:
        return ()
    return (("retry-after", after), (PUSHBACK, str(int(float(after) * 1000))))


def _busy(why: str) -> ProtocolError:
    return ProtocolError(f"the server is busy ({why}); retry later", 503, headers={"Retry-After": "1"})


def _client_deadline(remaining_s: float | None, received: float) -> float | None:
    """The client's deadline on the perf_counter clock (None: it set none): work still queued then is dropped."""
    return None if remaining_s is None else received + remaining_s


def _release_abandoned(work: asyncio.Future[tuple[bytes, Callable[[], None]]]) -> None:
    """The end of work whose call was cancelled: its answer goes nowhere, and its admission slot is freed."""
    if work.cancelled():
        return
    if work.exception() is not None:  # its slot was released where it failed
        log.debug("abandoned gRPC request ended with %r", work.exception())
        return
    _, release = work.result()
    release()


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
