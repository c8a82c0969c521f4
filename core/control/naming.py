"""Deterministic, DNS-1123 names for the objects the operator creates.

Names are how a restarted operator finds what it created before: the same
(policy, class, run key) always gives the same name, so "create if absent" is
idempotent and a crash between two API calls never yields a second run or Job.

Every name keeps a readable prefix (truncated when needed) and ends with a hash
of the full, untruncated inputs, so two long names that share a prefix still
differ, and "a-b" + "c" cannot collide with "a" + "b-c".

Limits: label values and Service names <= 63 (Services must also start with a
letter, DNS-1035); Job names <= 52 so the pods' ``<job>-<5 chars>`` names and
the ``job-name`` label stay within 63; other objects <= 253.
"""

from __future__ import annotations

import hashlib
import re

LABEL_MAX = 63
JOB_MAX = 52
SUBDOMAIN_MAX = 253
RUN_MAX = JOB_MAX  # a run's Job has the run's own name: one name to look for, not two
HASH_LEN = 8

_INVALID = re.compile(r"[^a-z0-9-]+")
_SERVICE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def digest(*parts: str, length: int = HASH_LEN) -> str:
    """Hex sha256 prefix of the parts, unambiguously separated."""
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:length]


def sanitize(text: str) -> str:
    """Lower-case DNS-1123 label characters; runs of anything else become one '-'."""
    return _INVALID.sub("-", text.lower()).strip("-")


def compose(parts: list[str], limit: int, *, letter_first: bool = False, hashed: list[str] | None = None) -> str:
    """``<readable parts joined by ->-<hash>``, at most ``limit`` characters; the hash covers ``hashed or parts``."""
    suffix = digest(*(parts if hashed is None else hashed))
    readable = "-".join(p for p in (sanitize(x) for x in parts) if p)
    if letter_first and not readable[:1].isalpha():
        readable = f"m-{readable}".rstrip("-")
    room = limit - len(suffix) - 1
    readable = readable[:room].rstrip("-")
    if not readable:
        return f"m{suffix}" if letter_first else suffix
    return f"{readable}-{suffix}"


def run_name(policy_name: str, class_name: str, key: str) -> str:
    """AdaptationRun name: a changed key (model, batch, spec) gives a new name, the same key the same one."""
    return compose([policy_name, class_name, key[:HASH_LEN]], RUN_MAX, hashed=[policy_name, class_name, key])


def job_name(run: str) -> str:
    """The Job of a run: the run's name when it fits the Job limit (run names always do)."""
    return run if len(run) <= JOB_MAX else compose([run], JOB_MAX)


def workload_name(policy_name: str, class_name: str) -> str:
    """Deployment and Service serving one policy on one class (a Service name: <= 63, starts with a letter)."""
    return compose([policy_name, class_name], LABEL_MAX, letter_first=True)


def policy_service_name(policy_name: str) -> str:
    """The one Service of a policy, in front of every serving pod of every class: the policy's own name when it is
    a valid Service name (DNS-1035, <= 63), else a readable prefix plus a hash. It never changes with classes,
    drivers or model versions, so it is the address clients keep."""
    if len(policy_name) <= LABEL_MAX and _SERVICE.match(policy_name):
        return policy_name
    return compose([policy_name], LABEL_MAX, letter_first=True)


def canary_name(policy_name: str, class_name: str) -> str:
    """The canary Deployment next to ``workload_name``'s stable one."""
    return f"{compose([policy_name, class_name], LABEL_MAX - len('-canary'), letter_first=True)}-canary"


def label_value(value: str) -> str:
    """``value`` if it is a valid label value, else a readable prefix plus a hash (<= 63)."""
    if _LABEL_VALUE.match(value) and len(value) <= LABEL_MAX:
        return value
    return compose([value], LABEL_MAX)
