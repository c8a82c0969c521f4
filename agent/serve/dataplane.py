"""The serving data plane: what every front end (REST in ``app``, gRPC in ``grpc_server``) shares, and nothing of
either protocol.

A front end decodes a request, then hands it here: ``admit`` (or ``admit_waiting``) takes one of the ``--max-queue``
admission slots, ``run_model`` runs it on the inference workers through the dynamic batcher within its deadline,
``unsent_reserve`` bounds the answers waiting for their readers; the front end encodes and sends the answer, and
releases the slot once it has left. Errors are ``ProtocolError`` (an HTTP status, which gRPC maps to its codes),
so the same event is answered and counted alike over every protocol.

Every request's cost is bounded here before it is paid, whatever protocol it came by:

* at most ``--max-queue`` complete inference requests are admitted at once (a slot is taken once the request is
  decoded, and held until the answer has been taken by the socket); beyond that the answer is 503 with
  Retry-After (``admit``), or, for a front end whose clients send bursts at once, a wait for a slot, first come
  first served, until the request's deadline (``admit_waiting``);
* the answers waiting for their readers are bounded (``--max-unsent-mib``, a share of it per connection);
* each request has a deadline (``--request-timeout`` from its arrival, or the client's own when shorter): one
  still queued then is answered without running, one still running is stopped between kernels
  (``deadlines.Watchdog``).

Latency is recorded in parts: queue wait (saturation) and compute (the variant on this hardware, what the
operator's drift check reads), plus the total. Idle, the data plane hands freed memory back (``trim_memory``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from metainfer.agent.serve import memory
from metainfer.agent.serve import model as model_loader
from metainfer.agent.serve.batching import Batcher, Health, RunOverdue
from metainfer.agent.serve.deadlines import DeadlineExceeded
from metainfer.agent.serve.metrics import Identity, ServingMetrics
from metainfer.agent.serve.protocol import ProtocolError, Signature, check_model, max_body_bytes
from metainfer.agent.serve.unsent import DEFAULT_MAX_UNSENT_MIB, UnsentBudget
from metainfer.core.engine.recipe import Recipe

log = logging.getLogger("metainfer.serve")
MODEL_VERSION = "1"
MAX_BODY_BYTES = 256 << 20  # whatever the model: the ceiling of the derived limit
UNSENT_CONNECTIONS = 4  # one connection may hold at most this share of --max-unsent-mib
TRIM_INTERVAL_S = 5.0  # how often an idle server that answered something hands freed memory back
_ORT_NODE = re.compile(r"(node\.? ?Name:\s*'[^']*'|Name:'[^']*'|node \S+ \(\S+\))", re.IGNORECASE)


# At the shutdown delay's end, a request this recent means the pod is still routed (``DataPlane.linger``).
STILL_ROUTED_S = 1.0


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``metainfer serve`` was told."""

    source: model_loader.ModelSourceArgs
    recipe: Recipe
    model_name: str
    host: str = "0.0.0.0"
    port: int = 8080
    max_batch: int | None = None
    drain_timeout_s: float = 20.0
    shutdown_delay_s: float = 5.0  # after SIGTERM: still answering, before the drain
    shutdown_delay_max_s: float = 0.0  # ... and on while requests still arrive, this long at most (``linger``)
    workers: int = 2
    max_queue: int = 64
    grpc_port: int = 0  # the KServe v2 gRPC front end (0: none); `metainfer serve` defaults to 8081
    request_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 15.0
    grpc_max_connection_age_s: float = 300.0  # 0: none
    write_timeout_s: float = 30.0  # for an answer to leave: a reader that does not take it is cut
    max_unsent_bytes: int = DEFAULT_MAX_UNSENT_MIB << 20  # answers computed but not yet taken by their clients
    max_dynamic_dim: int = 4096
    batch_size: int | None = None  # rows one run combines; None: the recipe's batch (what the adaptation measured)
    max_queue_delay_s: float = 0.001
    # A variant whose outputs depend on their run's other rows (Recipe.batch_dependent) runs each request alone.
    isolate_batch_dependent: bool = False
    # Decoders (serve/generation.py): the KV cache running generations may reserve, the longest prompt plus
    # max_tokens (None: the model's own, else DEFAULT_MAX_CONTEXT), and how many decode in one step.
    kv_cache_bytes: int = 256 << 20
    max_context: int | None = None
    max_generating: int = 16


class DataPlane:
    """State every front end shares: the loaded model (None until ready), the admission slots, the batcher, the
    budgets and the metrics."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.model: model_loader.LoadedModel | None = None
        self.leaving = False  # a signal came: every response closes its connection
        self.draining = False  # the delay is over: not listening, new requests refused
        identity = Identity.from_env(config.recipe.key())
        self.metrics = ServingMetrics(identity, config.model_name, config.recipe.describe())
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="infer")
        self.codec = ThreadPoolExecutor(max_workers=2, thread_name_prefix="codec")
        self.admitted = 0  # inference requests between admission and answer (queued or running)
        self._admission_waiters: collections.deque[asyncio.Future[Callable[[], None]]] = collections.deque()
        self.batcher: Batcher | None = None
        self._unhealthy = ""  # the last reason health() gave, so a stall is logged once, not at every probe
        self.unsent = UnsentBudget(config.max_unsent_bytes, max(1, config.max_unsent_bytes // UNSENT_CONNECTIONS))
        self.answered_since_trim = 0
        self.routed_at = -math.inf  # when the last REST inference request came: this pod was still routed then

    @property
    def ready(self) -> bool:
        """Whether this pod answers inference: also while it lingers after a signal (the module's docstring)."""
        return self.model is not None and not self.draining and self.health().ready

    def health(self) -> Health:
        """Whether inference can make progress (always, until the batcher has started)."""
        health = Health(True, True) if self.batcher is None else self.batcher.health()
        if not health.ready and health.reason != self._unhealthy:
            log.error("serving cannot make progress: %s", health.reason)
        self._unhealthy = health.reason
        self.metrics.stalled.set(0 if health.ready else 1)
        return health

    async def linger(self, delay_s: float, longest_s: float, cut_short: asyncio.Event) -> None:
        """Keep accepting and answering new requests (REST and gRPC), each response closing its connection, while
        the endpoints that route to this pod converge: for ``delay_s``, then for as long as REST inference requests
        still arrive (this pod is still routed: the last endpoint serving) until none has come for ``delay_s``, at
        most ``longest_s`` after the signal. Returns early when ``cut_short`` is set (a second signal).

        gRPC calls do not count: they come over HTTP/2 connections opened before the signal, which grpc.aio cannot
        end short of stopping, so they say nothing about where new connections go."""
        self.leaving = True
        if delay_s <= 0:
            return
        signalled = time.monotonic()
        lengthened = longest_s > delay_s
        deadline = signalled + max(delay_s, longest_s)
        log.info(
            "shutting down: still answering new requests for %g s while endpoints drop this pod%s (a second"
            " SIGTERM/SIGINT ends this delay)", delay_s,
            f", longer (at most {longest_s:g} s) while requests still come" if lengthened else "",
        )  # fmt: skip
        wake, told = signalled + delay_s, False
        while True:
            try:
                await asyncio.wait_for(cut_short.wait(), max(0.0, wake - time.monotonic()))
                log.info("second signal: shutdown delay cut short")
                return
            except TimeoutError:
                pass
            now, quiet_at = time.monotonic(), self.routed_at + delay_s
            # At the delay's end only a request of the last moment says the pod is still routed: the ones of the
            # second after the signal, while the endpoints converged, do not.
            recent = min(STILL_ROUTED_S, delay_s)
            if not lengthened or quiet_at <= now or (not told and now - self.routed_at > recent):
                return
            if now >= deadline:
                log.warning(
                    "shutdown delay: requests still came %.0f s after the signal; draining now (raise"
                    " --shutdown-delay-max if a replacement takes longer to be routed)", now - signalled,
                )  # fmt: skip
                return
            if not told:
                told = True
                log.info("shutdown delay: requests still come, so this pod is still routed; answering until none"
                         " has come for %g s", delay_s)  # fmt: skip
            wake = min(quiet_at, deadline)

    def stop_runs(self) -> int:
        """Stop the ONNX Runtime runs still in progress after the drain (between kernels); returns how many."""
        stopped = self.model.watchdog.terminate_all() if self.model is not None else 0
        if stopped:
            self.metrics.runs_stopped_at_drain.inc(stopped)
            log.warning("drain over: %d inference run(s) still in progress are stopped", stopped)
        return stopped

    # -- health and metadata ------------------------------------------------

    def unsent_reserve(self, connection: object, size: int) -> None:
        """Reserve ``size`` bytes of answer for ``connection``, or refuse the answer (503) when the answers already
        waiting for their clients (in total, or on this connection) leave no room."""
        if not self.unsent.reserve(connection, size):
            raise ProtocolError(
                f"the server holds {self.unsent.reserved} bytes of answers its clients have not read yet; retry"
                " later", 503, headers={"Retry-After": "1"},
            )  # fmt: skip

    async def trim_memory(self) -> None:
        """Every few seconds, while nothing is admitted and something was answered since, hand freed memory back."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(TRIM_INTERVAL_S)
            if self.answered_since_trim and self.admitted == 0:
                self.answered_since_trim = 0
                await loop.run_in_executor(self.codec, memory.trim)

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise ProtocolError(
                "the server is shutting down; retry (another replica answers)",
                503, headers={"Retry-After": "1", "Connection": "close"},
            )  # fmt: skip

    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        """One complete inference request admitted for the block (``admit``)."""
        release = self.admit()
        try:
            yield
        finally:
            release()

    def admit(self) -> Callable[[], None]:
        """Admit one complete inference request (REST or another front end) and return what releases its slot (once,
        however often it is called): refused with 503 when ``max_queue`` requests are already queued, running or
        being sent. Whether the server drains is checked when a request arrives (``refuse_if_draining``), not here:
        one that arrived before the drain began is served."""
        if self.admitted >= self.config.max_queue:
            raise ProtocolError(
                f"the server is busy ({self.admitted} requests queued or running); retry later",
                503, headers={"Retry-After": "1"},
            )  # fmt: skip
        self.admitted += 1
        return self._releaser()

    async def admit_waiting(self, received: float, client_deadline: float | None) -> Callable[[], None]:
        """``admit``, but a request that finds every slot taken waits for one, first come first served, until its
        deadline (``run_model``'s); then it is refused 503 with Retry-After. For front ends whose clients send a
        burst at once (gRPC: HTTP/2 made such a burst wait at the client before)."""
        if self.admitted < self.config.max_queue and not self._admission_waiters:
            return self.admit()
        deadline = received + self.config.request_timeout_s
        if client_deadline is not None:
            deadline = min(deadline, client_deadline)
        waiter: asyncio.Future[Callable[[], None]] = asyncio.get_running_loop().create_future()
        self._admission_waiters.append(waiter)
        handed: Callable[[], None] | None = None
        try:
            handed = await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - time.perf_counter()))
            return handed
        except TimeoutError:
            raise ProtocolError(
                f"the request waited {time.perf_counter() - received:.1f} s for one of the {self.config.max_queue}"
                " admission slots, past its deadline; retry later", 503, headers={"Retry-After": "1"},
            ) from None  # fmt: skip
        finally:
            if handed is None:  # timed out or cancelled: leave the line, and free a slot handed over meanwhile
                if waiter.done() and not waiter.cancelled():
                    waiter.result()()
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._admission_waiters.remove(waiter)

    def _releaser(self) -> Callable[[], None]:
        """What frees one admission slot, once however often it is called: handed to the first request waiting for
        one (``admit_waiting``), else returned."""
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            while self._admission_waiters:
                waiter = self._admission_waiters.popleft()
                if not waiter.done():
                    waiter.set_result(self._releaser())  # the slot changes hands: ``admitted`` stays
                    return
            self.admitted -= 1

        return release

    def body_limit(self, signature: Signature) -> tuple[int, str]:
        """The most bytes a legal request's (decoded) body or gRPC message needs, and the 413 message that names it."""
        limit = min(MAX_BODY_BYTES, max_body_bytes(signature, self.config.max_dynamic_dim))
        return limit, f"request larger than {limit} bytes, the most a request of batch <= {signature.max_batch} needs"

    async def run_model(
        self,
        model: model_loader.LoadedModel,
        inputs: dict[str, Any],
        outputs: list[str],
        received: float,
        client_deadline: float | None = None,
    ) -> dict[str, Any]:
        """The model on an inference worker (``received``: perf_counter() when the request arrived, its deadline
        counts from there; ``client_deadline``: an earlier one the client set, past which nobody waits for the
        answer); queue wait and compute time are recorded apart. Raises ProtocolError."""
        deadline = received + self.config.request_timeout_s
        # The client's own deadline, when earlier, is when the request may no longer start: a run already going is
        # not stopped for it. Stopping runs at every short client deadline stopped OpenVINO runs often enough to
        # meet its CPU plugin's failure after a cancel (later runs of the compiled model failing shape inference:
        # 26 of 18,114 runs of bert_mini with 474 cancels, none without cancels).
        clients = client_deadline is not None and client_deadline < deadline
        try:
            outcome = await self._batcher(model).submit(inputs, outputs, deadline, client_deadline if clients else None)
        except InvalidArgument as exc:
            raise ProtocolError(f"the inputs do not fit the model: {_public(str(exc))}") from exc
        except RunOverdue as exc:
            self.metrics.aborted("deadline")
            log.error("request answered without its run: %s (ONNX Runtime did not stop it in time)", exc)
            raise ProtocolError(f"{exc}; the server answers without it", 504, headers={"Retry-After": "1"}) from None
        except DeadlineExceeded as exc:
            self.metrics.aborted("deadline")
            log.warning("request stopped at its %g s deadline: %s", self.config.request_timeout_s, exc)
            raise ProtocolError(
                f"{exc}: the request took longer than its {self.config.request_timeout_s:g} s deadline"
                " (a smaller batch or shorter inputs run faster)", 503, headers={"Retry-After": "1"},
            ) from None  # fmt: skip
        except Exception as exc:
            log.exception("inference failed")
            raise ProtocolError(f"inference failed ({type(exc).__name__}); see the server log", status=500) from exc
        self.metrics.queue_wait.observe(outcome.waited_s)
        if outcome.results is None and clients:
            raise _client_deadline_passed(f"after {outcome.waited_s:.3f} s in the queue, before it ran")
        if outcome.results is None:
            raise ProtocolError(
                f"the request waited {outcome.waited_s:.1f} s for a worker, past its"
                f" {self.config.request_timeout_s:g} s deadline; retry later", 503, headers={"Retry-After": "1"},
            )  # fmt: skip
        self.metrics.compute.observe(outcome.compute_s)
        self.metrics.batch_rows.observe(outcome.batch_rows)
        return outcome.results

    def _batcher(self, model: model_loader.LoadedModel) -> Batcher:
        if self.batcher is None:
            signature = model.signature
            batchable = signature.dynamic_first_axes and model.batch_major
            if batchable and self.config.recipe.batch_dependent():
                if self.config.isolate_batch_dependent:
                    batchable = False
                    log.info("the variant's outputs depend on what shares its run: each request runs alone")
                else:
                    log.info(
                        "the variant's outputs depend on what shares its run: concurrent requests are combined, so"
                        " a request's outputs vary within what validation measured (report.json,"
                        " validation.batch_dependence); --batch-dependent isolate runs each request alone"
                    )
            self.batcher = Batcher(
                model.infer,
                self.executor,
                workers=self.config.workers,
                batch_rows=self.config.batch_size or self.config.recipe.batch,
                max_delay_s=self.config.max_queue_delay_s,
                batchable=batchable,
                stall_limit_s=self.config.request_timeout_s,
                on_failure=lambda exc: self.metrics.batcher_failures.inc(),
            )
        return self.batcher

    def loaded(self, name: str, version: str | None) -> model_loader.LoadedModel:
        """The model a request addressed to ``name`` (and ``version``) runs on: 404 for another one, 503 while it
        still loads."""
        check_model(name, version, self.config.model_name, MODEL_VERSION)
        if self.model is None:
            raise ProtocolError(f"model {self.config.model_name!r} is still loading", 503)
        return self.model


class FrontEnd(Protocol):
    """A door to the data plane besides REST's (gRPC): opened once the model is loaded, drained on SIGTERM."""

    async def start(self, host: str, port: int, signature: Signature) -> int: ...

    async def drain(self, timeout: float) -> int: ...


FrontEndFactory = Callable[[DataPlane], FrontEnd]


def _client_deadline_passed(when: str) -> ProtocolError:
    """The answer for a request whose client's own deadline (shorter than the server's) passed: the client's
    runtime reports DEADLINE_EXCEEDED at that moment anyway, and this answer, racing it, must say the same."""
    return ProtocolError(f"the call's deadline passed {when}", 504)


def _public(message: str) -> str:
    """An ONNX Runtime message without the graph's internal node names (they describe the variant, not the
    request), cut to its first line."""
    first = message.strip().splitlines()[0] if message.strip() else "rejected"
    return _ORT_NODE.sub("", first).replace("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ", "")[:300]


def server_version() -> str:
    """metainfer's version, as the servers' metadata says it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("metainfer")
    except PackageNotFoundError:
        return "0"
