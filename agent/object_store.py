"""Model and data URIs in object stores: ``s3://``, ``gs://``, ``az://`` and ``hf://``, with the store's credentials.

The clients are obstore's (Rust's object_store), not fsspec's s3fs/gcsfs/adlfs: s3fs needs botocore, whose
python-dateutil<3 pin cannot share an environment (or the image) with the kubernetes client, and one client for
S3, GCS and Azure keeps one error vocabulary and one TLS stack. ``hf://ORG/REPO[@REVISION]/PATH`` is the Hugging
Face Hub's resolve URL fetched over https (huggingface_hub would add a dependency for one GET).

Credentials come from a Secret the policy names (``spec.model.credentials.secretName``), mounted read-only into
the Job and the serving pods; its keys are the names the vendors' SDKs read from the environment, so a Secret a
team already has for its SDKs works as is (``SECRET_KEYS``). They are read from files, never from the pod's
environment: what the policy gets is exactly what the Secret holds.

Where a request may go is not the policy's to say: a store's endpoint comes from the Secret (whose writer chose
it) or is the vendor's public one, and it passes the same address guard as every http(s) URI
(agent/fetch_guard.py) before a byte is sent. Without a Secret the request is anonymous, unless the platform turned
on workload identity (``METAINFER_STORE_AMBIENT_CREDENTIALS``, the chart's ``modelStores.workloadIdentity``): then
the SDK chain of the pod's environment applies (web identity tokens, the ServiceAccount's annotations).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, unquote, urlsplit

from metainfer.agent.fetch_guard import RefusedAddress, check_host
from metainfer.core.api.pod_contract import ENV_STORE_AMBIENT_CREDENTIALS, ENV_STORE_CREDENTIALS

if TYPE_CHECKING:  # typing-only names of obstore's stubs
    from obstore.store import ClientConfig, RetryConfig

CREDENTIALS_ENV: Final = ENV_STORE_CREDENTIALS  # the directory the Secret is mounted at
AMBIENT_ENV: Final = ENV_STORE_AMBIENT_CREDENTIALS
PROXY_ENV = ("HTTPS_PROXY", "https_proxy")
NO_PROXY_ENV = ("NO_PROXY", "no_proxy")
CA_KEY = "ca.crt"
SCHEMES = ("s3", "gs", "az", "hf")
HF_DEFAULT_ENDPOINT = "https://huggingface.co"

# The Secret's keys each scheme reads (besides ca.crt), as the vendors' SDKs name them in the environment.
SECRET_KEYS: dict[str, tuple[str, ...]] = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"),
    "gs": ("GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_STORAGE_ENDPOINT"),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
           "AZURE_STORAGE_ENDPOINT"),
    "hf": ("HF_TOKEN", "HF_ENDPOINT"),
}  # fmt: skip
_MAX_KEY_BYTES = 64 << 10  # a service account key is ~2 KiB; a CA bundle a few dozen
_HF_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,128}$")


class StoreError(Exception):
    """The object could not be read; ``transient`` when another attempt may succeed."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Credentials:
    """What the mounted Secret holds (only the keys this module reads), and whether ambient identity applies."""

    values: dict[str, str] = field(default_factory=dict)
    ca_pem: str | None = None
    ambient: bool = False

    def get(self, key: str) -> str | None:
        return self.values.get(key)


def load_credentials(directory: str | os.PathLike[str] | None = None, *, ambient: bool | None = None) -> Credentials:
    """The credentials mounted at ``directory`` (default ``$METAINFER_STORE_CREDENTIALS``; none when unset).

    A missing or unreadable key is simply absent; a key that is not text, or is too large, is a StoreError naming
    it, since the Secret's writer must fix it."""
    if ambient is None:
        ambient = os.environ.get(AMBIENT_ENV, "").lower() in ("1", "true", "yes")
    where = directory if directory is not None else os.environ.get(CREDENTIALS_ENV)
    wanted = {key for keys in SECRET_KEYS.values() for key in keys}
    if not where:
        # Ambient: the process's own environment, under the same names (a platform that turned workload identity
        # on put them there, or a user running `metainfer adapt` on her machine).
        values = {key: value.strip() for key in sorted(wanted) if ambient and (value := os.environ.get(key))}
        return Credentials(values=values, ambient=ambient)
    root = Path(where)
    if not root.is_dir():
        raise StoreError(f"the store credentials directory {root} is not mounted (is the Secret there?)")
    values = {key: text for key in sorted(wanted) if (text := _read_key(root, key)) is not None}
    return Credentials(values=values, ca_pem=_read_key(root, CA_KEY), ambient=ambient)


def _read_key(root: Path, key: str) -> str | None:
    path = root / key
    if not path.is_file():
        return None
    data = path.read_bytes()
    if len(data) > _MAX_KEY_BYTES:
        raise StoreError(f"the credentials Secret's key {key} is {len(data)} bytes, more than {_MAX_KEY_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreError(f"the credentials Secret's key {key} is not UTF-8 text") from None
    return text if key == CA_KEY else text.strip()


@dataclass(frozen=True)
class ObjectAddress:
    """An object URI taken apart: scheme, bucket (container, or Hub repository), key inside it."""

    scheme: str
    bucket: str
    key: str
    revision: str = "main"  # hf:// only
    repo_type: str = "model"  # hf:// only: model, dataset or space


def parse(uri: str) -> ObjectAddress:
    """``uri`` as an address; StoreError says what a URI of its scheme looks like."""
    parts = urlsplit(uri)
    scheme, bucket, key = parts.scheme, parts.netloc, unquote(parts.path.lstrip("/"))
    if scheme not in SCHEMES:
        raise StoreError(f"{uri}: not an object store URI ({', '.join(s + '://' for s in SCHEMES)})")
    if parts.query or parts.fragment:
        raise StoreError(f"{uri}: an object URI takes no ?query or #fragment")
    if scheme != "hf":
        if not bucket or not key or key.endswith("/"):
            shape = {"s3": "s3://BUCKET/KEY", "gs": "gs://BUCKET/KEY", "az": "az://CONTAINER/BLOB"}[scheme]
            raise StoreError(f"{uri}: expected {shape}")
        return ObjectAddress(scheme, bucket, key)
    return _parse_hf(uri, bucket, parts.path.lstrip("/"))


def _parse_hf(uri: str, first: str, rest: str) -> ObjectAddress:
    """hf://ORG/REPO[@REVISION]/PATH, hf://datasets/ORG/REPO[@REVISION]/PATH (and spaces/); ``rest`` still quoted,
    so that a revision such as refs%2Fpr%2F1 stays one segment."""
    segments = [unquote(first), *(unquote(s) for s in rest.split("/"))] if rest else [unquote(first)]
    repo_type = "model"
    if segments[0] in ("datasets", "spaces"):
        repo_type, segments = segments[0][:-1], segments[1:]
    if len(segments) < 3 or not all(segments):
        raise StoreError(f"{uri}: expected hf://ORG/REPO[@REVISION]/PATH (or hf://datasets/ORG/REPO/PATH)")
    org, repo_rev, path = segments[0], segments[1], "/".join(segments[2:])
    repo, _, revision = repo_rev.partition("@")
    revision = revision or "main"
    if not _HF_REVISION.match(revision) or ".." in revision.split("/"):
        raise StoreError(f"{uri}: revision {revision[:80]!r} is not a branch, tag or commit")
    return ObjectAddress("hf", f"{org}/{repo}", path, revision=revision, repo_type=repo_type)


def endpoint(address: ObjectAddress, credentials: Credentials) -> str:
    """The URL the request goes to: the Secret's endpoint, else the vendor's public one."""
    get = credentials.get
    if address.scheme == "s3":
        region = get("AWS_REGION") or "us-east-1"
        return get("AWS_ENDPOINT_URL") or f"https://s3.{region}.amazonaws.com"
    if address.scheme == "gs":
        return get("GOOGLE_STORAGE_ENDPOINT") or "https://storage.googleapis.com"
    if address.scheme == "az":
        account = get("AZURE_STORAGE_ACCOUNT_NAME")
        if not get("AZURE_STORAGE_ENDPOINT") and not account:
            raise StoreError("az:// needs AZURE_STORAGE_ACCOUNT_NAME (or AZURE_STORAGE_ENDPOINT) in the credentials")
        return get("AZURE_STORAGE_ENDPOINT") or f"https://{account}.blob.core.windows.net"
    return (get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")


def guard_endpoint(url: str) -> None:
    """The address guard of every fetch, on the store's endpoint; StoreError when it is refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreError(f"the store endpoint {url[:200]!r} is not an http(s) URL")
    try:
        check_host(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    except RefusedAddress as exc:
        raise StoreError(str(exc)) from exc


def client_options(url: str, credentials: Credentials) -> ClientConfig:
    """obstore's client options: the Secret's CA bundle (added to the system roots), the platform's proxy."""
    options: ClientConfig = {
        "allow_http": url.startswith("http://"),
        "connect_timeout": timedelta(seconds=10),
        "timeout": timedelta(seconds=300),
    }
    if credentials.ca_pem:
        options["root_certificate"] = credentials.ca_pem
    if proxy := _first_env(PROXY_ENV):
        options["proxy_url"] = proxy
        if excludes := _first_env(NO_PROXY_ENV):
            options["proxy_excludes"] = excludes
    return options


def _first_env(names: Iterable[str]) -> str | None:
    return next((value for name in names if (value := os.environ.get(name))), None)


def store_config(address: ObjectAddress, credentials: Credentials) -> dict[str, Any]:
    """The store's configuration: the Secret's keys where it has them, anonymous where it has none (unless
    ambient identity is on, when the SDK chain of the pod's environment decides)."""
    get = credentials.get
    url = endpoint(address, credentials)
    config: dict[str, Any]
    if address.scheme == "s3":
        config = {"region": get("AWS_REGION") or "us-east-1"}
        if get("AWS_ENDPOINT_URL"):
            config["endpoint"] = url
        if get("AWS_ACCESS_KEY_ID") and get("AWS_SECRET_ACCESS_KEY"):
            config |= {"access_key_id": get("AWS_ACCESS_KEY_ID"), "secret_access_key": get("AWS_SECRET_ACCESS_KEY")}
            if token := get("AWS_SESSION_TOKEN"):
                config["session_token"] = token
        elif not credentials.ambient:
            config["skip_signature"] = True
    elif address.scheme == "gs":
        config = {"base_url": url} if get("GOOGLE_STORAGE_ENDPOINT") else {}
        if key := get("GOOGLE_SERVICE_ACCOUNT_KEY"):
            config["service_account_key"] = key
        elif not credentials.ambient:
            config["skip_signature"] = True
    else:
        config = {"endpoint": url}
        if account := get("AZURE_STORAGE_ACCOUNT_NAME"):
            config["account_name"] = account
        if key := get("AZURE_STORAGE_ACCOUNT_KEY"):
            config["account_key"] = key
        elif sas := get("AZURE_STORAGE_SAS_TOKEN"):
            config["sas_key"] = sas.lstrip("?")
        elif not credentials.ambient:
            config["skip_signature"] = True
    return config


def hf_url(address: ObjectAddress, credentials: Credentials) -> str:
    """The Hub's resolve URL of an hf:// address."""
    prefix = {"model": "", "dataset": "datasets/", "space": "spaces/"}[address.repo_type]
    revision = quote(address.revision, safe="")
    return f"{endpoint(address, credentials)}/{prefix}{address.bucket}/resolve/{revision}/{quote(address.key)}"


def read_object(uri: str, sink: Callable[[Iterable[bytes]], str], credentials: Credentials | None = None) -> str:
    """Stream the object at ``uri`` (s3://, gs://, az://) into ``sink``, which returns the sha256 of what it wrote.

    StoreError names the URI and the store's answer; missing objects and refused credentials are permanent, a
    timeout or a 5xx transient."""
    import obstore
    from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError
    from obstore.store import AzureStore, GCSStore, S3Store

    credentials = credentials if credentials is not None else load_credentials()
    address = parse(uri)
    if address.scheme == "hf":
        raise StoreError(f"{uri}: hf:// is fetched over https (hf_url), not through an object store client")
    url = endpoint(address, credentials)
    guard_endpoint(url)
    config, options = store_config(address, credentials), client_options(url, credentials)
    retry: RetryConfig = {"max_retries": 2, "retry_timeout": timedelta(seconds=30)}
    store: Any
    try:
        if address.scheme == "s3":
            store = S3Store(address.bucket, client_options=options, retry_config=retry, **config)
        elif address.scheme == "gs":
            store = GCSStore(address.bucket, client_options=options, retry_config=retry, **config)
        else:
            store = AzureStore(address.bucket, client_options=options, retry_config=retry, **config)
        result = obstore.get(store, address.key)
        return sink(bytes(chunk) for chunk in result.stream(min_chunk_size=1 << 20))
    except (NotFoundError, FileNotFoundError):  # obstore raises the builtin for a 404
        raise StoreError(f"{uri}: no such object at {url}") from None
    except (PermissionDeniedError, UnauthenticatedError, PermissionError) as exc:
        raise StoreError(
            f"{uri}: {url} refused the credentials ({_first_line(exc)}){_which(credentials, config)}"
        ) from None
    except StoreError:
        raise
    except Exception as exc:  # obstore's GenericError and friends: the network, a 5xx, a TLS failure
        message = _first_line(exc)
        permanent = any(word in message for word in ("certificate", "Unknown configuration", "Forbidden", "403"))
        raise StoreError(f"{uri}: {url}: {message}{_which(credentials, config)}", transient=not permanent) from None


def _which(credentials: Credentials, config: dict[str, Any]) -> str:
    if config.get("skip_signature"):
        return "; anonymous request (the credentials hold no keys for this store)"
    if credentials.values:
        return f"; credentials from the Secret's keys {', '.join(sorted(credentials.values))}"
    return "; no credentials (anonymous request)" if not credentials.ambient else "; ambient workload identity"


def _first_line(exc: BaseException) -> str:
    """obstore's messages carry a debug dump after the first lines; the status needs the reason only."""
    text = " ".join(line.strip() for line in str(exc).splitlines()[:3] if line.strip())
    return text[:400]
