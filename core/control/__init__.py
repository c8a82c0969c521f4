"""What the operator decides, as pure functions over API objects.

Hardware classes from node labels, the plan for a policy (runs to create,
rollouts to make), child manifests, run status from engine results, canary and
drift rules and their PromQL. The kopf handlers in metainfer.operator read
state, call these, and write the result: no Kubernetes client is imported here.
"""
