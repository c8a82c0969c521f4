"""The adaptation engine: everything that happens to one model on one machine.

Model transforms, the hardware profile, the search space and its searchers,
measurement and scoring, validation, and the pipeline that ties them together
(``metainfer adapt`` runs it as is; the agent runs it inside a Job). It knows
nothing of Kubernetes: the bottom layer, imported by core.api and core.control.
"""
