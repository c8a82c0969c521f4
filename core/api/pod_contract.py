"""The contract between the operator and the pods it creates: the command lines of ``metainfer agent run`` (the
adaptation Job), ``metainfer serve`` and ``metainfer check-provisional`` (serving pods), the environment variables
those pods read, the paths where the pod spec mounts what they read and write, and serve's ports.

The operator writes each of them (core.control.manifests) and the agent or serve reads it (agent/): a name spelled
differently on the two sides fails only in a cluster, as an unknown flag, a variable nobody reads or a file that is
not there. So each is spelled here once and both sides import it; a unit test, tests/unit/test_pod_contract.py,
fails on a copy spelled anywhere else in core, agent or operator, and checks that ``metainfer``'s parser accepts
every flag and subcommand named here.

Only names live here: defaults and meanings stay with the code that reads them. The operator's own settings
(``METAINFER_*`` of the operator's Deployment, operator/config.py) are another contract, with the Helm chart, and
are not in this module.
"""

from __future__ import annotations

from typing import Final

from metainfer.core.api.names import GROUP

# --- the command lines ------------------------------------------------------------------------------------------------

PROGRAM: Final = "metainfer"  # the console script (pyproject.toml [project.scripts]) every container runs
AGENT_COMMAND: Final = "agent"  # `metainfer agent run NAMESPACE/RUN`: the adaptation Job
AGENT_RUN_COMMAND: Final = "run"
SERVE_COMMAND: Final = "serve"  # the serving container
CHECK_PROVISIONAL_COMMAND: Final = "check-provisional"  # a provisional class's init container

# Flags of both `metainfer serve` and `metainfer check-provisional`: where the model, the variant and its data are.
FLAG_MODEL_URI: Final = "--model-uri"
FLAG_MODEL_SHA256: Final = "--model-sha256"
FLAG_RECIPE_JSON: Final = "--recipe-json"
FLAG_VARIANT_SHA256: Final = "--variant-sha256"
FLAG_VARIANT_STORE: Final = "--variant-store"
FLAG_DATA_URI: Final = "--data-uri"
FLAG_DATA_SHA256: Final = "--data-sha256"
FLAG_CALIBRATION_SAMPLES: Final = "--calibration-samples"

# Flags of `metainfer serve` only.
FLAG_RECIPE: Final = "--recipe"  # a recipe.json file: what check-provisional left
FLAG_VARIANT: Final = "--variant"  # a prebuilt variant: what check-provisional left
FLAG_PORT: Final = "--port"
FLAG_GRPC_PORT: Final = "--grpc-port"
FLAG_SHUTDOWN_DELAY: Final = "--shutdown-delay"
FLAG_DRAIN_TIMEOUT: Final = "--drain-timeout"
FLAG_MAX_QUEUE_DELAY_MS: Final = "--max-queue-delay-ms"
FLAG_BATCH_DEPENDENT: Final = "--batch-dependent"

# Flags of `metainfer check-provisional` only: the policy's budget, and where to leave what serve serves.
FLAG_MAX_QUALITY_DROP: Final = "--max-quality-drop"
FLAG_LATENCY_P95_MS: Final = "--latency-p95-ms"
FLAG_QUALITY_METRIC: Final = "--quality-metric"
FLAG_OUT: Final = "--out"

# --- environment variables -------------------------------------------------------------------------------------------

# Set on the adaptation Job.
ENV_RUN: Final = "METAINFER_RUN"  # NAMESPACE/RUN, as on its command line
ENV_NODE_NAME: Final = "NODE_NAME"  # the downward API's spec.nodeName: the node whose profile the agent measures
ENV_POD_NAME: Final = "POD_NAME"  # the downward API's metadata.name
ENV_VARIANT_STORE: Final = "METAINFER_VARIANT_STORE"  # VARIANT_STORE_MOUNT, where the policy has serving.variantStore

# Set on serving pods: the identity serve's metrics are labelled with, and its model's default name.
ENV_POLICY: Final = "METAINFER_POLICY"
ENV_NAMESPACE: Final = "METAINFER_NAMESPACE"  # the policy's
ENV_CLASS: Final = "METAINFER_CLASS"  # the class's fingerprint
ENV_RECIPE_KEY: Final = "METAINFER_RECIPE_KEY"
ENV_VARIANT: Final = "METAINFER_VARIANT"  # the run's variant key
# A variable, not a flag: a class may be served by an older image (the run's, after a chart upgrade that changed
# the runtime) whose serve would refuse an unknown flag, and ignores an unknown variable.
ENV_SHUTDOWN_DELAY_MAX: Final = "METAINFER_SHUTDOWN_DELAY_MAX_SECONDS"

# Set on both, where the platform's settings ask for them (agent/fetch_guard.py, agent/object_store.py).
ENV_FETCH_ALLOW_CIDRS: Final = "METAINFER_FETCH_ALLOW_CIDRS"
ENV_STORE_CREDENTIALS: Final = "METAINFER_STORE_CREDENTIALS"  # STORE_CREDENTIALS_MOUNT, where a policy names a Secret
ENV_STORE_AMBIENT_CREDENTIALS: Final = "METAINFER_STORE_AMBIENT_CREDENTIALS"

# Read by the agent and serve, never set by the operator: a platform adds them to a pod by hand, tests set them.
ENV_MAX_FETCH_BYTES: Final = "METAINFER_MAX_FETCH_BYTES"  # agent/fetch.py's size cap
ENV_FAST_MEASURE: Final = "METAINFER_FAST_MEASURE"  # agent/profiles.py's testing knob: tiny micro-benchmarks

# --- paths -----------------------------------------------------------------------------------------------------------

CACHE_DIR: Final = "/var/cache/metainfer"  # an emptyDir; XDG_CACHE_HOME points there
VARIANT_STORE_MOUNT: Final = "/var/lib/metainfer/variants"  # a policy's serving.variantStore (a PVC)
CONFIGMAP_MOUNT: Final = "/var/lib/metainfer/configmaps"  # configmap:// URIs, as files: serving pods have no API token
PROVISIONAL_MOUNT: Final = "/var/lib/metainfer/provisional"  # check-provisional's FLAG_OUT: an emptyDir serve reads
# What check-provisional leaves in PROVISIONAL_MOUNT, for serve's FLAG_VARIANT and FLAG_RECIPE.
PROVISIONAL_VARIANT_FILE: Final = "variant.onnx"
PROVISIONAL_RECIPE_FILE: Final = "recipe.json"
# Under /var/run/secrets, which a policy's own volume may not use (core.api.k8s_syntax.RESERVED_MOUNT_PREFIX).
STORE_CREDENTIALS_MOUNT: Final = f"/var/run/secrets/{GROUP}/model-store"
# Kubernetes' default terminationMessagePath: check-provisional writes what it found there, and the operator reads
# it from the init container's status (core.control.provisional).
TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"

# --- ports -----------------------------------------------------------------------------------------------------------

HTTP_PORT: Final = 8080  # serve's REST API, /metrics and probes (FLAG_PORT)
GRPC_PORT: Final = 8081  # serve's KServe v2 gRPC API (FLAG_GRPC_PORT)
