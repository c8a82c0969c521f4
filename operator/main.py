"""``metainfer operator``: run the kopf operator in this process.

Equivalent to ``kopf run -m metainfer.operator.handlers --all-namespaces``
plus metainfer's defaults (liveness endpoint, peering). Importing the
handlers module registers every handler; settings are applied on startup.
"""

from __future__ import annotations

import asyncio
import importlib

import kopf


def run(namespaces: list[str] | None, liveness: str | None, standalone: bool, verbose: bool) -> int:
    importlib.import_module("metainfer.operator.handlers")
    if verbose:
        kopf.configure(verbose=True)
    else:
        kopf.configure(verbose=False)
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces or [],
            liveness_endpoint=liveness,
            standalone=standalone,
        )
    )
    return 0
