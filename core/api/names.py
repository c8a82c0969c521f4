"""Every Kubernetes name metainfer reads or writes: the API group and version, the kinds and plurals of its
CRDs, and the keys of the labels, annotations and finalizer it puts on objects.

They are the contract with the API server, with objects an older operator wrote, and with anyone's
``kubectl -l`` or dashboard: each is spelled here once, and every other module imports it (a unit test,
tests/unit/test_names.py, fails on a copy spelled anywhere else in core, agent or operator). Values are written
out rather than composed from ``GROUP`` so that grepping for one finds its definition.

``ApiVersion`` and the ``*Kind`` types are ``Literal`` types of the same strings, for the pydantic models of
whole objects: a ``Literal`` cannot be built from a constant (mypy only accepts literal expressions in it), so the
string is written twice here and tests/unit/test_names.py checks that each type holds exactly its constant.
"""

from __future__ import annotations

from typing import Final, Literal

# --- the API ---------------------------------------------------------------------------------------------------------

GROUP: Final = "metainfer.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "metainfer.io/v1alpha1"  # GROUP/VERSION
ApiVersion = Literal["metainfer.io/v1alpha1"]

POLICY_KIND: Final = "AdaptationPolicy"
POLICY_PLURAL: Final = "adaptationpolicies"
POLICY_SINGULAR: Final = "adaptationpolicy"
PolicyKind = Literal["AdaptationPolicy"]

RUN_KIND: Final = "AdaptationRun"
RUN_PLURAL: Final = "adaptationruns"
RUN_SINGULAR: Final = "adaptationrun"
RunKind = Literal["AdaptationRun"]

PROFILE_KIND: Final = "HardwareProfile"
PROFILE_PLURAL: Final = "hardwareprofiles"
PROFILE_SINGULAR: Final = "hardwareprofile"
ProfileKind = Literal["HardwareProfile"]

PLURALS: Final = (POLICY_PLURAL, RUN_PLURAL, PROFILE_PLURAL)

# The product's name where Kubernetes asks for one: the value of MANAGED_BY on everything the operator creates,
# of PART_OF on the CRDs, and the CRDs' category (``kubectl get metainfer``).
PRODUCT: Final = "metainfer"

# --- labels ----------------------------------------------------------------------------------------------------------

# Recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels).
MANAGED_BY: Final = "app.kubernetes.io/managed-by"
COMPONENT: Final = "app.kubernetes.io/component"  # "adaptation" on Jobs, "serving" on serving pods and Services
PART_OF: Final = "app.kubernetes.io/part-of"

# On every child of (policy, class): runs, Jobs, Deployments, Services; the operator lists children by them.
LABEL_POLICY: Final = "metainfer.io/policy"
LABEL_CLASS: Final = "metainfer.io/class"  # the class's fingerprint
LABEL_RUN: Final = "metainfer.io/run"  # on a Job and a serving Deployment: the run it runs or serves
LABEL_RUN_KEY: Final = "metainfer.io/run-key"  # core.control.runkey: one run per key
LABEL_RECIPE_KEY: Final = "metainfer.io/recipe-key"  # also an annotation of serving pods (the full key)
LABEL_TRACK: Final = "metainfer.io/track"  # "stable" or "canary"
LABEL_PROVISIONAL: Final = "metainfer.io/provisional"  # "true" on a provisional class's pods: their check results

# On HardwareProfiles (cluster-scoped): the class and the namespace they were measured for.
LABEL_CLASS_FINGERPRINT: Final = "metainfer.io/class-fingerprint"
LABEL_NAMESPACE: Final = "metainfer.io/namespace"

# --- annotations -----------------------------------------------------------------------------------------------------

# On an AdaptationRun, for its Job: what the run spec has no field for.
ANNOTATION_TOLERATIONS: Final = "metainfer.io/tolerations"
ANNOTATION_CLASS_NAME: Final = "metainfer.io/class-name"
ANNOTATION_DRIFT_EPOCH: Final = "metainfer.io/drift-epoch"
# On an AdaptationPolicy, set by its owner: each new value re-adapts every class once (trigger Manual); the run
# carries the value it was started for, so the same value never starts a second run.
ANNOTATION_RERUN: Final = "metainfer.io/rerun"
# On each Deployment the operator applies: a digest of the manifest it applied, so an unchanged desired
# Deployment costs no write, and a changed one (new recipe, replicas, image) is applied again (core.control.serving).
ANNOTATION_SPEC_HASH: Final = "metainfer.io/spec-hash"

# --- the operator's own bookkeeping ----------------------------------------------------------------------------------

# kopf's finalizer, and the prefix of the annotations its progress and diff-base storages write.
FINALIZER: Final = "metainfer.io/finalizer"
KOPF_PREFIX: Final = GROUP
