"""``metainfer agent run NAMESPACE/RUN``: the adaptation Job's command.

One attempt: read the AdaptationRun, fetch and verify the model, get the
class's hardware profile (reused from the cluster or measured), run the
engine's search within the run's budget, and write progress and the outcome
into the run's status, with the sha256 of the validated variant's bytes.
When the policy names a variant store (``serving.variantStore``), the
variant is written there under that sha256, so serving pods load the very
bytes measured here; otherwise serving rebuilds it from the base model
(pinned by sha256) and the recipe, and checks the rebuild has that sha256.

Exit codes, chosen for a Job with a ``backoffLimit``:

* 0 -- the run's status holds its outcome: Succeeded, or Failed with a
  specific reason (ChecksumMismatch, InvalidModel, InvalidData,
  UnsupportedOperators, NoFeasibleCandidate, InvalidSpec, ModelFetchFailed
  for a permanent fetch error such as a 404 or a missing file). These
  failures are deterministic: a retry would only fail again, so the status
  is the result and the Job completes. A run where nothing met every
  constraint but FP32 (validated) misses only a latency bound succeeds with
  FP32, its message starting "SLO unmet", so the class keeps serving. Also 0
  when the run had already finished (a retried Job pod does no work twice).
  A retried pod of a run still searching resumes from the run's
  ``status.checkpoint``: the trials measured so far are replayed, not
  measured again.
* 2 -- usage: a malformed NAMESPACE/RUN, no Kubernetes configuration, or the
  run does not exist (deleting a run deletes its Job by owner reference).
* 75 (EX_TEMPFAIL) -- a transient failure: API server unreachable or 5xx,
  fetch timeout or HTTP 5xx. The Job retries; the run's conditions say why
  the attempt failed.
* 1 -- an unexpected error (a bug, out of memory): logged with its
  traceback, recorded in the conditions, and retried like a transient one so
  ``backoffLimit`` bounds it.

Stdout gets one line per stage; expected errors never print a traceback.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from metainfer.agent import variant_store
from metainfer.agent.fetch import FetchError, fetch
from metainfer.agent.inputs import load_data
from metainfer.agent.job_api import Kube, KubeError, api_client
from metainfer.agent.profiles import ensure_profile, measure_settings
from metainfer.agent.status import RunStatusWriter, StatusObserver
from metainfer.core.api.pod_contract import ENV_NODE_NAME
from metainfer.core.api.run import MAX_TRIALS, AdaptationRunSpec, AdaptationRunStatus
from metainfer.core.api.vocabulary import Reason, RunStage
from metainfer.core.control import checkpoint, runstatus, trial_history
from metainfer.core.control.memory_bound import DATA_PLANE_BUFFERS_MIB
from metainfer.core.engine.decoder.signature import DecoderSignature, detect
from metainfer.core.engine.errors import MetainferError, ModelError
from metainfer.core.engine.history import TrialHistory, source_from_report
from metainfer.core.engine.history_use import MAX_SOURCES
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.report import Report
from metainfer.core.engine.runtime import available_providers, provider_usability, require_accelerator
from metainfer.core.engine.trial import Trial

EXIT_OK, EXIT_FAILED_UNEXPECTEDLY, EXIT_USAGE, EXIT_RETRY = 0, 1, 2, 75


def log(message: str) -> None:
    print(f"metainfer agent: {message}", flush=True)


def parse_ref(ref: str) -> tuple[str, str]:
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"expected NAMESPACE/RUN, got {ref!r}")
    return namespace, name


def run_command(ref: str, kubeconfig: str | None) -> int:
    try:
        namespace, name = parse_ref(ref)
        kube = Kube(api_client(kubeconfig))
    except (ValueError, KubeError) as exc:
        print(f"metainfer: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        obj = kube.get_run(namespace, name)
    except KubeError as exc:
        log(str(exc))
        if exc.status == 404:
            return EXIT_USAGE
        return EXIT_RETRY if exc.transient else EXIT_FAILED_UNEXPECTEDLY
    try:
        return _run(kube, namespace, name, obj)
    except KubeError as exc:
        log(f"giving up this attempt: {exc}")
        return EXIT_RETRY if exc.transient else EXIT_FAILED_UNEXPECTEDLY


def _run(kube: Kube, namespace: str, name: str, obj: dict[str, Any]) -> int:
    try:
        status = AdaptationRunStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        status = AdaptationRunStatus()  # unreadable status: this attempt rewrites it
    if runstatus.is_finished(status):
        log(f"{namespace}/{name} already {status.phase}; nothing to do")
        return EXIT_OK
    generation = obj.get("metadata", {}).get("generation")
    writer = RunStatusWriter(kube, namespace, name, generation, status, log)
    try:
        spec = AdaptationRunSpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        message = f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return _fail(writer, Reason.INVALID_SPEC, message)
    log(f"{namespace}/{name}: model {spec.model.uri}, class {spec.class_fingerprint}, batch {spec.batch_size}")
    with tempfile.TemporaryDirectory(prefix="metainfer-run-") as tmp:
        return _attempt(kube, writer, spec, namespace, Path(tmp))


def _attempt(kube: Kube, writer: RunStatusWriter, spec: AdaptationRunSpec, namespace: str, workdir: Path) -> int:
    from metainfer.core.engine.modelinfo import inspect_model, load_model, model_bytes
    from metainfer.core.engine.pipeline import Adaptation

    started = time.monotonic()
    report = None
    try:
        writer.stage(RunStage.FETCHING, Reason.FETCHING, f"fetching the model from {spec.model.uri}")
        path = fetch(
            spec.model.uri,
            workdir / "model.onnx",
            expected_sha256=spec.model.sha256,
            namespace=namespace,
            configmaps=kube,
        )
        try:
            model = load_model(path)
            info = inspect_model(path, model)
        except ModelError as exc:  # name the URI the user wrote, not the agent's temp file
            raise ModelError(spec.model.uri, exc.problem) from exc
        decoder = detect(model)
        if decoder is not None:
            return _decoder(kube, writer, spec, namespace, model, model_bytes(path, model), decoder, started)
        data, note = load_data(spec.model, info, workdir, namespace, kube, spec.search.seed)
        notes = [note] if note else []
        log(f"model ok: {info.size_bytes} bytes, {len(info.op_counts)} op types; {data.n_samples} samples")
        writer.stage(RunStage.PROFILING, Reason.PROFILING, f"hardware profile of class {spec.class_fingerprint}")
        outcome = ensure_profile(kube, spec, namespace, os.environ.get(ENV_NODE_NAME), log)
        log(f"hardware profile {outcome.name} {'reused' if outcome.reused else 'measured and published'}")
        writer.status = writer.status.model_copy(update={"hardware_profile_name": outcome.name})
        # Here, not in the profile: a profile another node of the class published says nothing of this pod's device.
        usability = provider_usability(available_providers())
        require_accelerator(spec.hardware_class.vendor, usability)
        notes += [f"{p} unusable here: {why}" for p, why in usability.items() if why]
        unsupported = runstatus.unsupported_operators(info, outcome.profile)
        if unsupported is not None:
            raise unsupported
        floor = 0.0
        if spec.serving_memory_limit_mib is not None:  # what the serving container's limit leaves a variant
            from metainfer.agent.serve.floor import serve_floor_mib

            floor = serve_floor_mib()
        settings = runstatus.settings_from_spec(spec, measure_settings(), serve_floor_mib=floor)
        if (bound := settings.constraints.max_variant_memory_mib) is not None:
            notes.append(
                f"a variant may take {bound:.0f} MiB: the serving container's {spec.serving_memory_limit_mib} MiB less"
                f" serve's own {floor:.0f} MiB in this image and {DATA_PLANE_BUFFERS_MIB} MiB of data-plane buffers"
            )
        resumed, resumed_s = _checkpointed(writer.status)
        message = f"searching up to {settings.budget_trials} candidates ({settings.algorithm})"
        if resumed:
            message += f", resuming after {len(resumed)} trials an earlier attempt measured"
        writer.stage(RunStage.SEARCHING, Reason.SEARCHING, "; ".join([message, *notes]))
        observer = StatusObserver(
            writer, settings.budget_trials, started=started, resumed=resumed, resumed_search_s=resumed_s
        )
        history = _history(kube, namespace, spec)
        base = model_bytes(path, model)
        adaptation = Adaptation(base, info, data, outcome.profile, settings, observer, history=history)
        report, variant = adaptation.run(resume=resumed, resumed_search_s=resumed_s)
    except FetchError as exc:
        if exc.transient:
            log(f"fetch failed (transient): {exc}")
            writer.try_write(runstatus.mark_retrying(writer.status, writer.generation, exc.reason, str(exc)))
            return EXIT_RETRY
        return _fail(writer, exc.reason, str(exc))
    except KubeError:
        raise
    except MetainferError as exc:
        return _fail(writer, *runstatus.failure_reason(exc))
    except Exception as exc:
        if type(exc).__module__.startswith("onnxruntime"):  # ONNX Runtime rejected the model: deterministic
            return _fail(writer, *runstatus.failure_reason(exc))
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}"
        log(f"unexpected error: {message}")
        writer.try_write(runstatus.mark_retrying(writer.status, writer.generation, Reason.RETRY, message[:2000]))
        return EXIT_FAILED_UNEXPECTEDLY
    label = trial_history.source_label(writer.name, spec.class_description or spec.class_fingerprint)
    shipped = report.shipped()
    if shipped is None:
        reason, message = runstatus.failure_reason(runstatus.infeasible_error(report))
        return _fail(writer, reason, message, report=report, label=label)
    if report.best is None:
        # Nothing met every constraint, but FP32 (validated) misses only a latency bound: the class keeps serving
        # it, the status saying which bound is unmet, rather than serving nothing. Its bytes are the engine's
        # (cached from its validation, else rebuilt the same way).
        log(runstatus.slo_unmet_message(report))
        variant = adaptation.variant(shipped.recipe)
    variant_sha256 = None
    if variant is not None:
        variant_sha256, stored = _store_variant(variant)
        notes += [stored] if stored else []
        if shipped.recipe.session.runtime == "openvino":
            compiled_note = _store_compiled(variant, variant_sha256, shipped.recipe)
            notes += [compiled_note] if compiled_note else []
    done = runstatus.mark_succeeded(writer.status, writer.generation, report, notes, variant_sha256=variant_sha256)
    writer.write(_keep_history(done, report, label), final=True)
    log(f"succeeded: {shipped.recipe.describe()} (recipe {shipped.recipe.key()})")
    return EXIT_OK


def _decoder(
    kube: Kube, writer: RunStatusWriter, spec: AdaptationRunSpec, namespace: str, model: Any, base: bytes,
    signature: DecoderSignature, started: float,
) -> int:  # fmt: skip
    """A decoder's run: its own workload and candidates (agent/decoder_run.py); errors go to ``_attempt``'s
    handlers, as any model's."""
    from metainfer.agent.decoder_run import adapt_decoder_run
    from metainfer.core.control.decoder_runs import mark_decoder_succeeded
    from metainfer.core.engine.errors import NoFeasibleCandidate

    report, variant, notes = adapt_decoder_run(kube, writer, spec, namespace, model, base, signature, log)
    if report.shipped is None or variant is None:
        missed = "; ".join(f"{t.recipe.describe()}: {t.reason}" for t in report.trials[:5])
        why = f"no decoder candidate, FP32 included, meets the policy's decoder SLOs and memory: {missed}"
        return _fail(writer, *runstatus.failure_reason(NoFeasibleCandidate(why[:3000], [])))
    variant_sha256, stored = _store_variant(variant)
    notes += [stored] if stored else []
    done = mark_decoder_succeeded(writer.status, writer.generation, report, notes, MAX_TRIALS, variant_sha256,
                                  time.monotonic() - started)  # fmt: skip
    writer.write(done, final=True)
    log(f"succeeded: {report.shipped.recipe.describe()} (recipe {report.shipped.recipe.key()})")
    return EXIT_OK


def _store_variant(variant: bytes) -> tuple[str, str | None]:
    """The variant's sha256, and a note if the policy's variant store could not take it (serving then rebuilds)."""
    root = os.environ.get(variant_store.ENV)
    if not root:
        return variant_store.sha256_of(variant), None
    try:
        sha256, path = variant_store.put(Path(root), variant)
    except variant_store.StoreError as exc:
        log(f"variant store: {exc}; serving pods will rebuild the variant")
        return variant_store.sha256_of(variant), f"variant not stored ({exc}): serving pods rebuild it"
    log(f"variant stored: {path} ({len(variant)} bytes)")
    return sha256, None


def _store_compiled(variant: bytes, sha256: str, recipe: Recipe) -> str | None:
    """Compile the shipped OpenVINO variant into the store's compiled cache, so serving pods on this class import
    it instead of compiling; a note when that failed (pods then compile, which is slower to start, not wrong)."""
    root = os.environ.get(variant_store.ENV)
    if not root:
        return None
    from metainfer.core.engine.runtime import create_session
    from metainfer.core.engine.runtime_openvino import compiled_cache_key

    def compile_into(directory: Path) -> None:
        create_session(variant, recipe, compiled_cache=directory)

    try:
        path = variant_store.put_compiled(Path(root), compiled_cache_key(sha256, recipe), compile_into)
    except (variant_store.StoreError, MetainferError) as exc:
        log(f"compiled cache: {exc}; serving pods will compile the variant")
        return f"compiled model not stored ({str(exc)[:300]}): serving pods compile it"
    log(f"OpenVINO compiled model stored: {path}")
    return None


def _checkpointed(status: AdaptationRunStatus) -> tuple[list[Trial], float]:
    """The trials an earlier attempt of this run measured (its Job's pod died mid-search), if any are readable."""
    if status.checkpoint is None:
        return [], 0.0
    try:
        trials = checkpoint.decode(status.checkpoint)
    except checkpoint.CheckpointUnreadable as exc:
        log(str(exc))
        return [], 0.0
    log(f"resuming: {len(trials)} trials measured by an earlier attempt, {status.checkpoint.search_seconds:.0f}s")
    return trials, status.checkpoint.search_seconds


def _fail(writer: RunStatusWriter, reason: str, message: str, report: Report | None = None, label: str = "") -> int:
    log(f"failed: {reason}: {message.splitlines()[0]}")
    failed = runstatus.mark_failed(writer.status, writer.generation, reason, message, report)
    writer.write(_keep_history(failed, report, label) if report is not None else failed, final=True)
    return EXIT_OK


def _history(kube: Kube, namespace: str, spec: AdaptationRunSpec) -> TrialHistory | None:
    """The trial histories of the runs the operator named in spec.historyFrom (same namespace); a run that is gone
    or unreadable is left out, never fatal: the search then starts colder, which is correct, only slower."""
    if not spec.history_from:
        return None
    sources = []
    for name in spec.history_from:
        try:
            status = AdaptationRunStatus.model_validate((kube.get_run(namespace, name).get("status")) or {})
        except (KubeError, ValidationError) as exc:
            log(f"history: run {name} left out ({str(exc).splitlines()[0][:200]})")
            continue
        if status.trial_history is None:
            log(f"history: run {name} kept no trials")
            continue
        try:
            sources.append(trial_history.decode(status.trial_history))
        except trial_history.HistoryUnreadable as exc:
            log(f"history: run {name} left out ({exc})")
    trials = sum(len(s.trials) for s in sources)
    log(f"history: {len(sources)} of {len(spec.history_from)} earlier runs, {trials} trials")
    return TrialHistory(sources=sources[:MAX_SOURCES])


def _keep_history(status: AdaptationRunStatus, report: Report, label: str) -> AdaptationRunStatus:
    """The ended run's status with its own trials kept for later runs (and what its history did)."""
    try:
        source = source_from_report(report, label)
    except ValueError as exc:  # a trial the bounded history cannot hold loses only the history
        log(f"history: this run's trials are not kept ({type(exc).__name__}: {str(exc)[:200]})")
        source = None
    return trial_history.with_history(status, source, report.search_wall_s, report.history)
