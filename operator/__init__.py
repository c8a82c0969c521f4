"""metainfer.operator: kopf handlers, thin shells around metainfer.core."""

import metainfer.core  # noqa: F401  # first: it switches the runtimes' telemetry off before any of them loads
