"""The adaptation Job's path for a decoder language model (``agent run`` finds one in the fetched model).

Profiled like any model (the class's profile is published and reused), then the decoder's candidates are measured
on its own workload (``core.engine.decoder.adapt``) with the policy's ``slo.decoder`` settings, and the shipped
variant goes to the variant store and the run's status (``core.control.decoder_runs``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import onnx

from metainfer.agent.decoder_adapt import build_candidate, candidate_recipes, candidate_session, decoder_codec
from metainfer.agent.job_api import Kube
from metainfer.agent.profiles import ensure_profile
from metainfer.agent.status import RunStatusWriter
from metainfer.core.api.pod_contract import ENV_NODE_NAME
from metainfer.core.api.run import AdaptationRunSpec
from metainfer.core.api.vocabulary import Reason, RunStage
from metainfer.core.control.decoder_runs import decoder_settings
from metainfer.core.engine.decoder import adapt as decoder_adapt
from metainfer.core.engine.decoder.quality import reference_text
from metainfer.core.engine.decoder.signature import DecoderSignature
from metainfer.core.engine.decoder.tokenizer import carried_context
from metainfer.core.engine.decoder.workload import prompt_from_text
from metainfer.core.engine.runtime import (
    available_providers,
    provider_usability,
    require_accelerator,
)


def adapt_decoder_run(
    kube: Kube, writer: RunStatusWriter, spec: AdaptationRunSpec, namespace: str, model: onnx.ModelProto,
    base: bytes, signature: DecoderSignature, log: Callable[[str], None],
) -> tuple[decoder_adapt.DecoderReport, bytes | None, list[str]]:  # fmt: skip
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    codec = decoder_codec(metadata, spec.model.uri)
    writer.stage(RunStage.PROFILING, Reason.PROFILING, f"hardware profile of class {spec.class_fingerprint}")
    outcome = ensure_profile(kube, spec, namespace, os.environ.get(ENV_NODE_NAME), log)
    writer.status = writer.status.model_copy(update={"hardware_profile_name": outcome.name})
    usability = provider_usability(available_providers())
    require_accelerator(spec.hardware_class.vendor, usability)
    notes = [f"{p} unusable here: {why}" for p, why in usability.items() if why]
    workload, constraints = decoder_settings(spec, carried_context(metadata))
    recipes = candidate_recipes(model, signature)
    writer.stage(RunStage.SEARCHING, Reason.SEARCHING,
                 f"decoder ({len(signature.layers)} layers, {signature.form}): measuring up to "
                 f"{min(len(recipes), spec.search.trial_budget)} candidates on a {workload.prompt_tokens}-token "
                 f"prompt and {workload.decode_tokens} decoded tokens, {workload.concurrency} streams")  # fmt: skip
    text_ids = codec.encode(reference_text())
    prompt = prompt_from_text(text_ids, workload.prompt_tokens)
    started = time.monotonic()

    def measured(trial: decoder_adapt.DecoderTrial) -> None:
        log(f"trial: {trial.describe()} ({time.monotonic() - started:.0f}s)")

    report, variant = decoder_adapt.adapt(
        base, signature, text_ids, prompt, workload, constraints, recipes, build_candidate, candidate_session,
        budget=spec.search.trial_budget, on_trial=measured,
    )  # fmt: skip
    return report, variant, notes
