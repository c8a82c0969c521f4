"""The metainfer.io/v1alpha1 API: pydantic types of the three CRDs, the Kubernetes names (names.py) and the
securityContext types the operator's pods use (security.py).

These types are the single source of truth: crds/*.yaml is generated from them
(``python -m metainfer.core.api.crdgen crds/``) and the operator and agent parse and
build objects with them. Pure: no Kubernetes client here.
"""

from metainfer.core.api.conditions import Condition, ConditionType, Reason, get_condition, set_condition
from metainfer.core.api.hardwareprofile import HardwareProfileResource, HardwareProfileSpec, HardwareProfileStatus
from metainfer.core.api.names import API_VERSION, GROUP, VERSION
from metainfer.core.api.policy import AdaptationPolicy, AdaptationPolicySpec, AdaptationPolicyStatus, ClassStatus
from metainfer.core.api.resources import ADAPTATION_POLICY, ADAPTATION_RUN, HARDWARE_PROFILE, RESOURCES, Resource
from metainfer.core.api.run import AdaptationRun, AdaptationRunSpec, AdaptationRunStatus

__all__ = [
    "ADAPTATION_POLICY",
    "ADAPTATION_RUN",
    "API_VERSION",
    "GROUP",
    "HARDWARE_PROFILE",
    "RESOURCES",
    "VERSION",
    "AdaptationPolicy",
    "AdaptationPolicySpec",
    "AdaptationPolicyStatus",
    "AdaptationRun",
    "AdaptationRunSpec",
    "AdaptationRunStatus",
    "ClassStatus",
    "Condition",
    "ConditionType",
    "HardwareProfileResource",
    "HardwareProfileSpec",
    "HardwareProfileStatus",
    "Reason",
    "Resource",
    "get_condition",
    "set_condition",
]
