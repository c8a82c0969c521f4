"""The three CRDs: names, scope, printer columns, and the models of spec and status.

core/api/crdgen.py turns each ``Resource`` into a CustomResourceDefinition. Printer
columns point at status fields the operator maintains for exactly this purpose
(conditions for Ready, summaries for counts), never at handler internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from metainfer.core.api.hardwareprofile import HardwareProfileSpec, HardwareProfileStatus
from metainfer.core.api.names import (
    GROUP,
    POLICY_KIND,
    POLICY_PLURAL,
    POLICY_SINGULAR,
    PRODUCT,
    PROFILE_KIND,
    PROFILE_PLURAL,
    PROFILE_SINGULAR,
    RUN_KIND,
    RUN_PLURAL,
    RUN_SINGULAR,
)
from metainfer.core.api.policy import AdaptationPolicySpec, AdaptationPolicyStatus
from metainfer.core.api.run import AdaptationRunSpec, AdaptationRunStatus
from metainfer.core.api.vocabulary import ConditionType

CATEGORY = PRODUCT  # kubectl get metainfer


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class Resource:
    kind: str
    plural: str
    singular: str
    scope: Literal["Namespaced", "Cluster"]
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = (CATEGORY,)
    columns: tuple[PrinterColumn, ...] = field(default_factory=tuple)

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


def _ready(type_: ConditionType = ConditionType.READY) -> tuple[PrinterColumn, PrinterColumn]:
    return (
        PrinterColumn(str(type_), "string", f'.status.conditions[?(@.type=="{type_}")].status'),
        PrinterColumn("Reason", "string", f'.status.conditions[?(@.type=="{type_}")].reason', priority=1),
    )


_AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp")

ADAPTATION_POLICY = Resource(
    kind=POLICY_KIND,
    plural=POLICY_PLURAL,
    singular=POLICY_SINGULAR,
    scope="Namespaced",
    spec=AdaptationPolicySpec,
    status=AdaptationPolicyStatus,
    description="Adapts one ONNX model to every matching hardware class in the cluster and keeps it adapted.",
    short_names=("ap", "adaptpol"),
    columns=(
        PrinterColumn("SLO p95", "number", ".spec.slo.latencyP95Ms", "p95 latency SLO, ms"),
        PrinterColumn("Batch", "integer", ".spec.slo.batchSize", "Production batch size"),
        PrinterColumn("Classes", "string", ".status.classesSummary", "Ready/selected hardware classes"),
        PrinterColumn(
            "Worst class p95", "number", ".status.worstClassP95Ms", "The highest p95 among the served variants, ms"
        ),
        *_ready(),
        PrinterColumn("Model", "string", ".spec.model.version", "Model version", priority=1),
        PrinterColumn("Suspended", "boolean", ".spec.suspend", "No new runs or rollouts while true", priority=1),
        PrinterColumn("Pinned", "string", ".status.pinned", "The variant spec.pin serves, in words", priority=1),
        PrinterColumn("Endpoint", "string", ".status.endpoint", "The policy's stable Service address", priority=1),
        _AGE,
    ),
)

ADAPTATION_RUN = Resource(
    kind=RUN_KIND,
    plural=RUN_PLURAL,
    singular=RUN_SINGULAR,
    scope="Namespaced",
    spec=AdaptationRunSpec,
    status=AdaptationRunStatus,
    description="One adaptation of a policy's model to one hardware class (profile, search, validate).",
    short_names=("ar", "adaptrun"),
    columns=(
        PrinterColumn("Policy", "string", ".spec.policyName"),
        PrinterColumn("Class", "string", ".spec.classDescription", "The hardware class in words"),
        PrinterColumn("Trigger", "string", ".spec.reason"),
        PrinterColumn("Trials", "integer", ".status.progress.trialsCompleted"),
        PrinterColumn("Best p95", "number", ".status.bestMetrics.p95Ms", "p95 of the best variant, ms"),
        PrinterColumn("Phase", "string", ".status.phase"),
        PrinterColumn("Fingerprint", "string", ".spec.classFingerprint", "HardwareClass.fingerprint()", priority=1),
        PrinterColumn(
            "Saved", "integer", ".status.history.trialsSaved", "Trials the history of earlier runs spared", priority=1
        ),
        PrinterColumn("History from", "string", ".status.history.fromClasses", "Classes of the history", priority=1),
        *_ready(ConditionType.SUCCEEDED),
        _AGE,
    ),
)

HARDWARE_PROFILE = Resource(
    kind=PROFILE_KIND,
    plural=PROFILE_PLURAL,
    singular=PROFILE_SINGULAR,
    scope="Cluster",
    spec=HardwareProfileSpec,
    status=HardwareProfileStatus,
    description="A hardware class and its measured inference capabilities, shared by the policies of one namespace.",
    short_names=("hwp",),
    columns=(
        PrinterColumn("Vendor", "string", ".spec.hardwareClass.vendor"),
        PrinterColumn("Product", "string", ".spec.hardwareClass.product"),
        PrinterColumn("Driver", "string", ".spec.hardwareClass.driverVersion"),
        PrinterColumn("Fingerprint", "string", ".spec.fingerprint"),
        PrinterColumn("Namespace", "string", ".spec.namespace"),
        PrinterColumn("Measured", "date", ".status.measuredAt"),
        *_ready(),
        _AGE,
    ),
)

RESOURCES: tuple[Resource, ...] = (ADAPTATION_POLICY, ADAPTATION_RUN, HARDWARE_PROFILE)
