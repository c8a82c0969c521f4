"""A real container registry for the development cluster and the tests: CNCF Distribution, TLS and htpasswd.

Distribution (github.com/distribution/distribution/v3, Apache-2.0; the registry most others descend from and the
reference implementation of the OCI distribution spec) is built with Go at a pinned version and cached, like the
control plane and helm. It serves HTTPS only, with a certificate the caller gives (the cluster's own CA in the
development cluster) and basic auth from an htpasswd file (bcrypt), so nothing is pulled or pushed anonymously.

``push_archive`` uploads an OCI image archive (what ``make image`` writes) through the distribution API and
returns the manifest's digest, the reference a chart then pins (``image.digest``); ``push_chart`` packages the
chart and pushes it as an OCI artifact with helm. ``make cluster-up`` starts one for the development node
(``ClusterRegistry``: its address, CA and credentials, saved under the cluster's root for ``make image``).

    .venv/bin/python -m hack.controlplane.registry   # build (or find) the binary and print its path
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
import json
import os
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from hack.controlplane import assets, oci
from hack.controlplane.errors import AssetError, ControlPlaneError
from hack.controlplane.processes import free_port, stop_child

REGISTRY_VERSION = "v3.1.2"
REGISTRY = assets.GoBinary(
    name="registry",
    module="github.com/distribution/distribution/v3",
    version=REGISTRY_VERSION,
    package="github.com/distribution/distribution/v3/cmd/registry",
)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CHUNK = 1 << 20


class RegistryError(ControlPlaneError):
    pass


def provide(log: assets.Log = print) -> Path:
    """The registry binary: ``METAINFER_REGISTRY_BIN``, the cache, or a fresh Go build into the cache."""
    return assets.provide_go_binary(REGISTRY, "METAINFER_REGISTRY_BIN", log)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def authorization(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def docker_config(self, registry: str) -> str:
        """A `.dockerconfigjson` (what a kubernetes.io/dockerconfigjson Secret holds) for ``registry``."""
        auth = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return json.dumps({"auths": {registry: {"username": self.username, "password": self.password, "auth": auth}}})


@dataclass
class RegistryServer:
    """One registry process on ``host:port`` serving HTTPS with ``cert``/``key`` and basic auth for ``credentials``;
    blobs under ``workdir``. ``start()`` returns once ``/v2/`` answers (401 without credentials)."""

    binary: Path
    workdir: Path
    cert: Path
    key: Path
    ca: Path
    credentials: Credentials
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``host:port``, as image references and `helm push oci://` name the registry."""
        return f"{self.host}:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "registry.log"

    def write_config(self) -> Path:
        """The registry's config file (and its htpasswd) under ``workdir``; `registry serve` takes it."""
        import bcrypt  # the dev extra's: the registry reads only bcrypt hashes from its htpasswd file

        self.workdir.mkdir(parents=True, exist_ok=True)
        hashed = bcrypt.hashpw(self.credentials.password.encode(), bcrypt.gensalt(rounds=10)).decode()
        htpasswd = self.workdir / "htpasswd"
        htpasswd.write_text(f"{self.credentials.username}:{hashed}\n")
        config = {
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}, "delete": {"enabled": True}},
            "http": {
                "addr": self.address,
                # Signs upload-session state: fixed per registry so a restart keeps uploads in flight valid.
                "secret": hashlib.sha256(str(self.workdir).encode()).hexdigest(),
                "tls": {"certificate": str(self.cert), "key": str(self.key)},
            },
            "auth": {"htpasswd": {"realm": "metainfer", "path": str(htpasswd)}},
        }
        path = self.workdir / "config.yml"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        return path

    def answers(self) -> bool:
        """Whether the registry serves its API (a 401 to an anonymous client is the healthy answer)."""
        try:
            return _request(self.address, self.ca, "GET", "/v2/", None).status == 401
        except OSError:
            return False

    def start(self, timeout_s: float = 30.0) -> RegistryServer:
        config = self.write_config()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RegistryError(f"registry exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if self.answers():
                return self
            time.sleep(0.2)
        self.stop()
        raise RegistryError(f"registry did not answer on {self.address} within {timeout_s:.0f}s: {self.log}")

    def stop(self) -> None:
        stop_child(self.proc)
        self.proc = None


CLUSTER_REGISTRY_FILE = "registry.json"


@dataclass(frozen=True)
class ClusterRegistry:
    """The development cluster's registry as ``make image`` and the e2e suite reach it: loopback address (the
    node's containerd pulls from it; no pod can reach it), the cluster CA that signed its certificate, and the
    one account htpasswd knows. Saved 0600 under the cluster's root: the password is a secret."""

    address: str
    ca: Path
    credentials: Credentials

    def save(self, directory: Path) -> None:
        path = directory / CLUSTER_REGISTRY_FILE
        data = {"address": self.address, "ca": str(self.ca), **dataclasses.asdict(self.credentials)}
        path.touch(mode=0o600)
        path.write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, directory: Path) -> ClusterRegistry | None:
        path = directory / CLUSTER_REGISTRY_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return cls(data["address"], Path(data["ca"]), Credentials(data["username"], data["password"]))

    def push_image(self, archive: Path, repository: str, tag: str) -> str:
        """``archive`` as ``address/repository:tag``; returns the manifest digest."""
        return push_archive(archive, self.address, repository, tag, self.credentials, self.ca)

    def push_chart(self, helm: Path, chart: Path, workdir: Path) -> tuple[str, str, str]:
        """Package ``chart`` and ``helm push`` it under ``oci://address/charts``; returns (reference, version,
        digest): ``helm install <reference> --version <version>`` installs it."""
        workdir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(workdir / "config"),
            "HELM_CACHE_HOME": str(workdir / "cache"),
            "HELM_DATA_HOME": str(workdir / "data"),
        }
        self.helm_login(helm, env)
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        name, version = meta["name"], str(meta["version"])
        _helm(helm, env, "package", str(chart), "--destination", str(workdir))
        package = workdir / f"{name}-{version}.tgz"
        pushed = _helm(helm, env, "push", str(package), f"oci://{self.address}/charts", "--ca-file", str(self.ca))
        digest = next((line.split()[-1] for line in pushed.splitlines() if line.startswith("Digest:")), "")
        if not digest.startswith("sha256:"):
            raise RegistryError(f"helm push printed no digest:\n{pushed}")
        return f"oci://{self.address}/charts/{name}", version, digest

    def helm_login(self, helm: Path, env: dict[str, str]) -> None:
        """``helm registry login`` with the password on stdin, into the registry config ``env`` names (helm's
        default under HELM_CONFIG_HOME, or HELM_REGISTRY_CONFIG): later helm commands then authenticate without
        the password on their command line, where ps and a failed command's message would show it."""
        _helm(helm, env, "registry", "login", self.address, "--username", self.credentials.username,
              "--password-stdin", "--ca-file", str(self.ca), stdin=self.credentials.password)  # fmt: skip


def _helm(helm: Path, env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(helm), *args], input=stdin, capture_output=True, text=True, env=env, timeout=300, check=False
    )
    if result.returncode != 0:
        raise RegistryError(f"helm {args[0]} failed (exit {result.returncode}): {result.stderr[-2000:]}")
    return result.stdout + result.stderr


@dataclass(frozen=True)
class _Response:
    status: int
    headers: dict[str, str]
    body: bytes


def _request(
    address: str,
    ca: Path,
    method: str,
    path: str,
    credentials: Credentials | None,
    *,
    body: bytes | SizedStream | None = None,
    headers: dict[str, str] | None = None,
) -> _Response:
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca))
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=120)
    sent = dict(headers or {})
    if credentials is not None:
        sent["Authorization"] = credentials.authorization()
    try:
        if isinstance(body, SizedStream):
            sent["Content-Length"] = str(body.size)
            connection.putrequest(method, path)
            for key, value in sent.items():
                connection.putheader(key, value)
            connection.endheaders()
            while chunk := body.stream.read(_CHUNK):
                connection.send(chunk)
        else:
            connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return _Response(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


@dataclass(frozen=True)
class SizedStream:
    """A request body read in chunks and sent with a Content-Length: a layer streamed straight out of the archive,
    never copied to disk first (a CUDA layer is gigabytes on a disk the node's images share)."""

    stream: IO[bytes]
    size: int


def push_archive(archive: Path, address: str, repository: str, tag: str, credentials: Credentials, ca: Path) -> str:
    """Upload an OCI image archive as ``address/repository:tag``; returns the manifest's digest (``sha256:...``).

    Blobs the registry already holds are not sent again (HEAD first), so pushing a rebuilt image sends only the
    layers that changed; the others stream from the archive."""
    with tarfile.open(archive) as tar:
        manifest = oci.read_manifest(tar)
        manifest_bytes = manifest.raw
        base = f"/v2/{repository}/blobs"
        for digest in dict.fromkeys(manifest.blob_digests):
            if _request(address, ca, "HEAD", f"{base}/{digest}", credentials).status == 200:
                continue
            started = _request(address, ca, "POST", f"{base}/uploads/", credentials, body=b"")
            if started.status != 202 or "location" not in started.headers:
                raise RegistryError(f"starting the upload of {digest}: HTTP {started.status} {started.body[:300]!r}")
            location = urllib.parse.urlsplit(started.headers["location"])
            query = [*urllib.parse.parse_qsl(location.query), ("digest", digest)]
            put = f"{location.path}?{urllib.parse.urlencode(query)}"
            name = oci.blob_name(digest)
            with oci.member(tar, name) as source:
                body = SizedStream(source, tar.getmember(name).size)
                done = _request(address, ca, "PUT", put, credentials, body=body,
                                headers={"Content-Type": "application/octet-stream"})  # fmt: skip
            if done.status != 201:
                raise RegistryError(f"uploading {digest}: HTTP {done.status} {done.body[:300]!r}")
        stored = _request(address, ca, "PUT", f"/v2/{repository}/manifests/{tag}", credentials,
                          body=manifest_bytes, headers={"Content-Type": OCI_MANIFEST})  # fmt: skip
        if stored.status != 201:
            raise RegistryError(
                f"storing the manifest of {repository}:{tag}: HTTP {stored.status} {stored.body[:300]!r}"
            )
        digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
        answered = stored.headers.get("docker-content-digest", digest)
        if answered != digest:
            raise RegistryError(f"the registry stored the manifest as {answered}, not {digest}")
        return digest


def manifest_digest(address: str, repository: str, reference: str, credentials: Credentials | None, ca: Path) -> str:
    """The digest the registry serves for ``repository:reference`` (HTTP status text when it refuses)."""
    response = _request(address, ca, "HEAD", f"/v2/{repository}/manifests/{reference}", credentials,
                        headers={"Accept": OCI_MANIFEST})  # fmt: skip
    if response.status != 200:
        return f"HTTP {response.status}"
    return response.headers["docker-content-digest"]


if __name__ == "__main__":
    try:
        print(provide(lambda message: print(message, file=sys.stderr)))
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
