"""Install CustomResourceDefinitions and wait until the API server serves them.

Installation is create-or-replace, so re-running ``up`` after ``make crds``
updates the schemas in place. "Established" is the condition that says the
new REST endpoints exist; "NamesAccepted" false means a name clash.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack.controlplane.errors import StartError


def load_crds(paths: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(paths):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
    return docs


def install(api_client: client.ApiClient, crds: list[dict[str, Any]], *, timeout_s: float = 30.0) -> list[str]:
    """Create or replace each CRD, then wait for all to be Established; returns their names."""
    api = client.ApiextensionsV1Api(api_client)
    names: list[str] = []
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            api.create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 409:
                raise StartError(f"CRD {name} rejected by the API server: {exc.body}") from exc
            current = api.read_custom_resource_definition(name)
            body = dict(crd)
            body["metadata"] = {**crd["metadata"], "resourceVersion": current.metadata.resource_version}
            api.replace_custom_resource_definition(name, body)
        names.append(name)
    wait_established(api_client, names, timeout_s=timeout_s)
    return names


def wait_established(api_client: client.ApiClient, names: list[str], *, timeout_s: float = 30.0) -> None:
    api = client.ApiextensionsV1Api(api_client)
    deadline = time.monotonic() + timeout_s
    pending = list(names)
    while pending:
        name = pending[0]
        conditions = {c.type: c for c in (api.read_custom_resource_definition(name).status.conditions or [])}
        names_accepted = conditions.get("NamesAccepted")
        if names_accepted is not None and names_accepted.status == "False":
            raise StartError(f"CRD {name}: names not accepted: {names_accepted.message}")
        established = conditions.get("Established")
        if established is not None and established.status == "True":
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise StartError(f"CRD {name} not Established after {timeout_s}s: {conditions}")
        time.sleep(0.1)
