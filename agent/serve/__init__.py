"""``metainfer serve``: one adapted variant behind the Open Inference Protocol (KServe v2 REST).

Why a small aiohttp server and not kserve's ModelServer. kserve 0.21 was
installed into a scratch venv to look at it: it pulls in fastapi, uvicorn,
uvloop, grpcio and grpcio-tools, pandas, pillow, cloudevents, opentelemetry,
orjson and a second copy of the Kubernetes client — about 450 MB of
site-packages — and ``import kserve`` alone takes ~2 s and ~125 MB RSS on
the 2-core dev box, before any model loads. What we would use of it is the
v2 route table and JSON codec, which are a few hundred lines; what we need
beyond it (sha256-verified fetch, deterministic variant rebuild, provenance
checks, readiness only after warm-up, our own metric names and labels for the
operator's PromQL, a bounded drain on SIGTERM) we would write either way.
aiohttp is already installed as kopf's dependency, is well maintained, has
graceful shutdown built into its runner (stop listening, wait for in-flight
handlers up to a timeout, then cancel), and imports in ~0.5 s. So the server
adds no new runtime dependency, and the serving image stays the agent image.
Compatibility is checked the way it matters: tritonclient's HTTP client, with
its defaults (binary tensor extension), runs against the real server in tests.

Modules: ``protocol`` (pure v2 JSON/binary <-> numpy, unit-tested), ``model``
(fetch, rebuild or check, warm up), ``metrics`` (Prometheus series),
``dataplane`` (what every front end shares: admission, batching, deadlines,
budgets, model calls), ``app`` (the REST front end and the process: routes,
errors, signals, drain), ``grpc_server`` (the gRPC front end; app and
grpc_server import dataplane, never each other), ``command`` (CLI arguments ->
ServeConfig, and the composition of the front ends).
"""
