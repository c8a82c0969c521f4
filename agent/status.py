"""Writing one AdaptationRun's status while the agent works on it.

``RunStatusWriter`` keeps the status the agent believes in and patches the
status subresource with it whole (conditions and trials are replaced as
lists, never merged item by item). Progress during the search goes through
``StatusObserver``, core's pipeline Observer, which patches at most every
``interval_s`` seconds: a fast search must not turn into an API-server load
test. Each progress patch also carries the search checkpoint (every trial
measured so far, core.control.checkpoint), which a retried Job resumes from.
A failed progress patch is logged and skipped; only the final outcome must
reach the API server (it is retried, and its failure fails the attempt).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from metainfer.agent.job_api import Kube, KubeError
from metainfer.core.api.run import AdaptationRunStatus
from metainfer.core.api.vocabulary import Reason, RunStage, TrialState
from metainfer.core.control import checkpoint, runstatus
from metainfer.core.engine.phases import PipelinePhase
from metainfer.core.engine.trial import Trial

PROGRESS_INTERVAL_S = 2.0
FINAL_ATTEMPTS = 4

# Pipeline phases -> RunProgress.stage and the Progressing condition's reason.
STAGES: dict[PipelinePhase, tuple[RunStage, Reason]] = {
    PipelinePhase.PROFILING: (RunStage.PROFILING, Reason.PROFILING),
    PipelinePhase.BASELINE: (RunStage.BASELINE, Reason.SEARCHING),
    PipelinePhase.SEARCH: (RunStage.SEARCHING, Reason.SEARCHING),
    PipelinePhase.SENSITIVITY: (RunStage.SENSITIVITY, Reason.SEARCHING),
    PipelinePhase.VALIDATION: (RunStage.VALIDATING, Reason.VALIDATING),
    PipelinePhase.FINAL_COMPARISON: (RunStage.FINAL_COMPARISON, Reason.VALIDATING),
}


@dataclass
class RunStatusWriter:
    kube: Kube
    namespace: str
    name: str
    generation: int | None
    status: AdaptationRunStatus
    log: Callable[[str], None]

    def write(self, status: AdaptationRunStatus, *, final: bool = False) -> None:
        """Patch ``status``; a final write is retried with backoff and raises KubeError when it cannot land."""
        self.status = status
        body = runstatus.status_to_api(status)
        if final and status.checkpoint is None:
            body["checkpoint"] = None  # merge patch: a finished run drops its checkpoint (to_api leaves None out)
        attempts = FINAL_ATTEMPTS if final else 1
        for attempt in range(attempts):
            try:
                self.kube.patch_run_status(self.namespace, self.name, body)
                return
            except KubeError as exc:
                if not exc.transient or attempt == attempts - 1:
                    raise
                time.sleep(2.0**attempt)

    def try_write(self, status: AdaptationRunStatus) -> None:
        """Best-effort write (progress): a failure is one log line, the work goes on."""
        try:
            self.write(status)
        except KubeError as exc:
            self.log(f"progress not written: {exc}")

    def stage(self, stage: RunStage, reason: Reason, message: str) -> None:
        self.log(f"stage {stage}: {message}")
        self.write(runstatus.mark_running(self.status, self.generation, stage, reason, message))


@dataclass
class StatusObserver:
    """core.engine.phases.Observer that turns the engine's progress into throttled status patches."""

    writer: RunStatusWriter
    trial_budget: int
    started: float = field(default_factory=time.monotonic)
    interval_s: float = PROGRESS_INTERVAL_S
    trials: int = 0
    feasible: int = 0
    resumed: list[Trial] = field(default_factory=list)  # measured by an earlier attempt, replayed by the pipeline
    resumed_search_s: float = 0.0
    _stage: RunStage | None = None
    _last_write: float = 0.0
    _measured: list[Trial] = field(default_factory=list)
    _search_started: float | None = None
    _checkpoint_full: bool = False

    def __post_init__(self) -> None:
        self._measured = list(self.resumed)
        self.trials = len(self.resumed)
        self.feasible = sum(t.status == TrialState.FEASIBLE for t in self.resumed)

    def phase(self, phase: PipelinePhase, total: int | None, detail: str = "") -> None:
        stage, reason = STAGES[phase]
        if phase == PipelinePhase.SEARCH and self._search_started is None:
            self._search_started = time.monotonic()
        if stage == self._stage:
            return
        self._stage = stage
        self.writer.log(f"stage {stage}")
        message = f"{phase} ({detail})" if detail else str(phase)
        status = runstatus.mark_running(self.writer.status, self.writer.generation, stage, reason, message)
        self._flush(status, force=True)

    def advance(self, label: str) -> None:
        self._flush(self.writer.status)

    def trial(self, trial: Trial, best: Trial | None) -> None:
        self.trials += 1
        self._measured.append(trial)
        if self._stage != RunStage.SEARCHING:  # back from a sensitivity analysis the search triggered
            self._stage = RunStage.SEARCHING
            self.writer.status = runstatus.mark_running(
                self.writer.status, self.writer.generation, RunStage.SEARCHING, Reason.SEARCHING, PipelinePhase.SEARCH
            )
        self.feasible += trial.status == TrialState.FEASIBLE
        outcome = str(trial.status)
        if trial.metrics is not None:
            outcome += f", p95 {trial.metrics.latency.p95_ms:.3f} ms"
        self.writer.log(f"trial {trial.index}/{self.trial_budget}: {trial.recipe.describe()} -> {outcome}")
        self._flush(self.writer.status)

    def _flush(self, status: AdaptationRunStatus, force: bool = False) -> None:
        status = runstatus.with_progress(
            status,
            trials_completed=self.trials,
            feasible_trials=self.feasible,
            elapsed_seconds=time.monotonic() - self.started,
            trial_budget=self.trial_budget,
        )
        self.writer.status = status
        now = time.monotonic()
        if force or now - self._last_write >= self.interval_s:
            self._last_write = now
            self.writer.try_write(self._with_checkpoint(status, now))

    def _with_checkpoint(self, status: AdaptationRunStatus, now: float) -> AdaptationRunStatus:
        if not self._measured or self._checkpoint_full:
            return status
        searched = self.resumed_search_s + (now - self._search_started if self._search_started is not None else 0)
        saved = checkpoint.encode(self._measured, searched)
        if saved is None:  # a very long search: a retry would start over, which is slower, not wrong
            self._checkpoint_full = True
            self.writer.log(f"checkpoint of {len(self._measured)} trials too large for the status; no longer saved")
            return status
        return status.model_copy(update={"checkpoint": saved})
