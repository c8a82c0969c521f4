"""The syntax Kubernetes itself applies to values a policy copies into Jobs and Deployments.

A value the CRD accepts but the API server rejects in the derived object (a
label key with a space, a quantity "lots", a toleration value with operator
Exists) used to be retried every few seconds forever with a stale status. The
same rules are checked at admission here, as CRD patterns and CEL (RE2, so no
look-arounds), and in Python where the CRD cannot say it (comparing quantities).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from metainfer.core.api.pod_contract import CACHE_DIR, VARIANT_STORE_MOUNT

DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A qualified name: an optional DNS subdomain prefix and '/', then a name of at most 63 characters.
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
QUANTITY = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
IMAGE = r"^[^\s]+$"
# Mount paths the pod itself uses (core.api.pod_contract): a second volume there is rejected (or would hide the
# service account token).
RESERVED_MOUNT_PATHS = ("/tmp", CACHE_DIR, VARIANT_STORE_MOUNT)
RESERVED_MOUNT_PREFIX = "/var/run/secrets"

_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_QUANTITY = re.compile(QUANTITY)


def parse_quantity(value: int | str) -> Decimal:
    """The amount a Kubernetes quantity stands for (``500m`` -> 0.5, ``4Gi`` -> 4294967296); ValueError if none."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)")
    digits, rest = match.group(1), match.group(3) or ""
    try:
        if rest[:1] in ("e", "E"):
            return Decimal(digits) * Decimal(10) ** int(rest[1:])
        return Decimal(digits) * _SUFFIX[rest]
    except (InvalidOperation, KeyError) as exc:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from exc


def is_reserved_mount_path(path: str) -> bool:
    path = path.rstrip("/") or "/"
    return path in RESERVED_MOUNT_PATHS or path == RESERVED_MOUNT_PREFIX or path.startswith(RESERVED_MOUNT_PREFIX + "/")
