"""metainfer.agent: what runs on a node: the CLI, the profiling/search Job, serving."""

import metainfer.core  # noqa: F401  # first: it switches the runtimes' telemetry off before any of them loads
