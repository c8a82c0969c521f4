"""The run key: what identifies one adaptation of a policy's model to one hardware class.

One run per key: the key is part of the run's name (core.control.naming.run_name) and its run-key label, so the
reconcile finds the run the policy's current spec asks for (core.control.decisions, ``ClassContext.run_key``),
creates it if absent (core.control.runs, through core.control.manifests.build_run), and a restarted operator finds
the same one. A leaf of core.control: the planning modules and the builders that use the key import it, and it
imports none of them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from metainfer.core.api.policy import AdaptationPolicySpec
from metainfer.core.control.memory_bound import serving_memory_limit_mib

# Spec fields added after keys were first handed out: hashed only when set to something other than their default,
# so an operator upgrade that adds one keeps every existing run key (and re-adapts nothing).
ADDED_LATER: dict[tuple[str, str], Any] = {
    ("slo", "qualityMetric"): "auto",
    ("slo", "decoder"): None,  # decoder language models
    ("searchSpace", "quantizers"): None,
    ("searchSpace", "activations"): None,
    # The execution-provider options (core.engine.knobs.providers).
    **{
        ("searchSpace", field): None
        for field in (
            "cudaConvAlgoSearches",
            "cudaTf32",
            "cudaArenaExtendStrategies",
            "tensorrtFp16",
            "tensorrtBuilderOptimizationLevels",
            "openvinoEpPrecisions",
            "openvinoEpStreams",
            # Weight-only quantization (core.engine.knobs.weights).
            "weightBits",
            "weightMethods",
            "weightBlockSizes",
            "weightSymmetric",
            "weightAccuracyLevels",
            "weightEmbeddings",
            "maxWeightKeepFloatLayers",
            "weightInt4Percents",
        )
    },
}


def run_key(
    policy_spec: AdaptationPolicySpec | Mapping[str, Any],
    generation: int,
    class_fingerprint: str,
    drift_epoch: str | None = None,
    rerun: str | None = None,
    runtime: str | None = None,
) -> str:
    """16 hex digits identifying one adaptation: model sha256, batch size, class, and what the run snapshots.

    ``generation`` is recorded in the run (spec.policyGeneration) but deliberately not hashed: hashing it would
    re-adapt every class when only serving replicas or rollout settings change. Instead the key covers exactly the
    spec the run copies (model, slo, objective, searchSpace, search), so any change that would change the run's
    snapshot changes the key, and nothing else does.

    ``drift_epoch`` (the class's last confirmed latency drift) salts the key: re-adapting the same spec after a drift
    needs a new run name, and an unset epoch adds nothing, so a class that never drifted keeps its run names.
    ``rerun`` (the policy's metainfer.io/rerun annotation, a manual re-run) salts it the same way, and so does
    ``runtime`` (the ONNX Runtime build the platform's image runs: a variant's bytes and latency depend on it), so a
    chart upgrade that changes the runtime re-adapts each class, and one that does not changes no key.
    The policy's own serving memory limit (``spec.serving.resources``) bounds the search (core.control.memory_bound),
    so a new one adapts again; a policy without one keeps its key, and the platform's default limit, which bounds
    its search too, is left out so that an operator upgrade re-adapts nothing.
    """
    del generation  # see docstring
    spec = _policy_spec(policy_spec)
    snapshot = spec.model_dump(
        mode="json", by_alias=True, include={"model", "slo", "objective", "search_space", "search"}
    )
    snapshot["search"].pop("maxConcurrentRuns", None)  # a scheduling limit, not part of the result
    # What the model is read with, not what it is (its sha256 pins that): rotating the Secret re-adapts nothing.
    snapshot["model"].pop("credentials", None)
    for (section, field), default in ADDED_LATER.items():
        if snapshot[section].get(field) == default:
            del snapshot[section][field]
    payload: list[Any] = [spec.model.sha256, spec.slo.batch_size, class_fingerprint, snapshot]
    if drift_epoch:
        payload.append({"driftEpoch": drift_epoch})
    if rerun:
        payload.append({"rerun": rerun})
    if runtime:
        payload.append({"runtime": runtime})
    if (own_limit := serving_memory_limit_mib(spec.serving.resources, None)) is not None:
        payload.append({"servingMemoryLimitMiB": own_limit})
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _policy_spec(spec: AdaptationPolicySpec | Mapping[str, Any]) -> AdaptationPolicySpec:
    return spec if isinstance(spec, AdaptationPolicySpec) else AdaptationPolicySpec.model_validate(spec)
