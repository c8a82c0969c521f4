"""How much memory a class's variant may take: the policy's memory SLO and its serving container's limit.

A variant whose serving process outgrows its container's memory limit is OOM-killed: the class would lose its
pods one by one, each restart loading the same variant. So the limit the class's serving pods run under (the
policy's ``serving.resources``, else the platform's serving defaults) bounds the search, beside the policy's
``slo.maxMemoryMiB``. What the limit leaves the variant is the limit less serve's own floor (its process with
its libraries loaded and no model, which the Job measures in the same image: ``metainfer.agent.serve.floor``) and
less what the data plane may hold on top under load: its unsent answers (``serve --max-unsent-mib``, 64 MiB by
default) and the gRPC messages waiting for admission (64 MiB). The search measures each candidate's own memory
(``TrialMetrics.variant_memory_mib``: the process's high-water mark above what it held just before loading it),
not the agent's whole process, whose floor (the search's libraries, the base model's bytes, the reference outputs)
says nothing about a serving pod's.

A serving pod that rebuilds its variant from the recipe holds the base model while it quantizes: a class with a
tight limit should load its variants from a variant store (``serving.variantStore``), as Jobs then write them.

The run records the limit (``spec.servingMemoryLimitMiB``) so that the Job reads one number and the run key
changes with it: a tighter limit adapts the class again.
"""

from __future__ import annotations

import math

from metainfer.core.api.k8s_syntax import parse_quantity
from metainfer.core.api.policy import ResourceRequirements
from metainfer.core.control.settings import merged_resources

# What serve may hold beyond the variant and its floor: agent/serve/unsent.py DEFAULT_MAX_UNSENT_MIB plus
# agent/serve/grpc_server.py WAITING_BYTES (a unit test keeps them equal).
DATA_PLANE_BUFFERS_MIB = 64 + 64
_MIB = 1 << 20


def serving_memory_limit_mib(own: ResourceRequirements | None, platform: ResourceRequirements | None) -> int | None:
    """The memory limit of the serving container (the policy's resources, else the platform's), whole MiB down."""
    limit = merged_resources(own, platform).get("limits", {}).get("memory")
    if limit is None:
        return None
    return max(1, math.floor(parse_quantity(limit) / _MIB))


def variant_memory_bound_mib(serving_limit_mib: int | None, serve_floor_mib: float) -> float | None:
    """What the serving container's limit leaves the variant itself, or None without a limit; at least 1 MiB (a
    limit below serve's floor and buffers leaves no variant feasible, and the run says which limit it missed)."""
    if serving_limit_mib is None:
        return None
    return max(1.0, serving_limit_mib - DATA_PLANE_BUFFERS_MIB - serve_floor_mib)
