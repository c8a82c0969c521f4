"""An S3-compatible object store for the tests and the development cluster: S3Proxy, with credentials.

S3Proxy (github.com/gaul/s3proxy, Apache-2.0) serves the S3 API over a directory (Apache jclouds' filesystem
provider): one Java process, no build. Its jar is fetched once from Maven's repository at a pinned version,
checked against a pinned sha256 and cached; MinIO, the usual choice, is AGPL and excluded, and SeaweedFS, used
before, took 5-6 minutes of Go build on a cold 2-core machine for a store the tests start three times. One access
key has every right and nobody else any: an anonymous request gets 403, so every bucket is private, as a company's
model bucket is. With a certificate it serves HTTPS only (a store behind a private CA, as users' often are).
This is the server; the agent's client for it (and for GCS, Azure and the Hub) is agent/object_store.py.

A bucket is a directory under the store's data directory: ``ObjectStore.create_bucket`` and
``ClusterObjectStore.put`` make one there (the platform team's step; the agent only reads).

    .venv/bin/python -m hack.controlplane.s3proxy   # fetch (or find) the jar and print its path
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from hack.controlplane import apt, assets
from hack.controlplane.errors import AssetError, ControlPlaneError
from hack.controlplane.processes import free_port, stop_child

S3PROXY_VERSION = "2.6.0"
S3PROXY_ARTIFACT = f"org.gaul:s3proxy:{S3PROXY_VERSION}:jar:jar-with-dependencies"
S3PROXY_JAR = f"s3proxy-{S3PROXY_VERSION}-jar-with-dependencies.jar"
# The jar Maven's repository served on 2026-12-07: a different one is refused, not run.
S3PROXY_SHA256 = "12e5e88d805cfed07f7d88b4a44a0d8ecb9f9d3cebeb544bb34fbc4ded1049d8"
# What a fresh Debian machine lacks to fetch and run it: Maven (which brings a JDK) and a Java runtime.
JAVA_PACKAGE = "openjdk-17-jre-headless"
MAVEN_PACKAGE = "maven"
# A small heap, the serial collector and the first JIT tier: a test store serves a few MiB, and on 2 cores the
# default JVM's parallel GC and C2 compiler threads would take CPU from the tests beside it (startup about 2 s).
JVM_FLAGS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
SHUTDOWN_GRACE_S = 3.0  # throwaway data: nothing to flush


class ObjectStoreError(ControlPlaneError):
    pass


@dataclass(frozen=True)
class S3Proxy:
    """How to run S3Proxy here: a Java runtime and the verified jar."""

    java: Path
    jar: Path

    def argv(self, properties: Path) -> list[str]:
        return [str(self.java), *JVM_FLAGS, "-jar", str(self.jar), "--properties", str(properties)]


def _tool(name: str, package: str, override_env: str) -> Path:
    """``name`` from ``override_env``, PATH, or Debian's ``package`` installed now (root only)."""
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    found = shutil.which(name)
    if found is None and os.geteuid() == 0:
        apt.install([package])
        found = shutil.which(name)
    if found is None:
        raise AssetError(f"S3Proxy needs {name} on PATH: install Debian's {package} (or set {override_env})")
    return Path(found)


def provide(log: assets.Log = print) -> S3Proxy:
    """Java and the S3Proxy jar: ``METAINFER_S3PROXY_JAR``, the cache, or Maven's download into the cache."""
    java = _tool("java", JAVA_PACKAGE, "METAINFER_JAVA")
    override = os.environ.get("METAINFER_S3PROXY_JAR")
    if override:
        if not Path(override).is_file():
            raise AssetError(f"METAINFER_S3PROXY_JAR={override} is not a file; unset it to fetch S3Proxy")
        return S3Proxy(java, Path(override))
    directory = assets.cache_root() / "s3proxy" / S3PROXY_VERSION
    target = directory / S3PROXY_JAR
    if target.is_file():
        return S3Proxy(java, target)
    directory.mkdir(parents=True, exist_ok=True)
    with assets.lock(directory.parent / f"{S3PROXY_VERSION}.lock"):
        if not target.is_file():  # another process may have fetched it while we waited
            _fetch(directory, target, log)
    return S3Proxy(java, target)


def _fetch(directory: Path, target: Path, log: assets.Log) -> None:
    mvn = _tool("mvn", MAVEN_PACKAGE, "METAINFER_MVN")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=directory) as staging:
        command = [
            str(mvn), "-q", "-B", "dependency:copy", f"-Dartifact={S3PROXY_ARTIFACT}", f"-DoutputDirectory={staging}",
            # Maven's own downloads (the dependency plugin, the jar) stay in this project's cache too.
            f"-Dmaven.repo.local={assets.cache_root() / 'm2'}",
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        fetched = Path(staging) / S3PROXY_JAR
        if result.returncode != 0 or not fetched.is_file():
            tail = (result.stdout + result.stderr).strip()[-1500:]
            raise AssetError(f"fetching {S3PROXY_ARTIFACT} with Maven failed (exit {result.returncode}): {tail}")
        with fetched.open("rb") as handle:
            got = hashlib.file_digest(handle, "sha256").hexdigest()
        if got != S3PROXY_SHA256:
            raise AssetError(f"{S3PROXY_ARTIFACT} has sha256 {got}, not the pinned {S3PROXY_SHA256}: not used")
        fetched.replace(target)
    log(f"fetched S3Proxy {S3PROXY_VERSION} into {target} in {time.monotonic() - started:.0f}s")


@dataclass(frozen=True)
class S3Credentials:
    """An access key pair, as AWS SDKs read it (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."""

    access_key: str
    secret_key: str

    @classmethod
    def generate(cls) -> S3Credentials:
        return cls("metainfer-" + secrets.token_hex(6), secrets.token_urlsafe(30))


def _private_file(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.write_bytes(data)


@dataclass
class ObjectStore:
    """One S3Proxy on ``host:port``, its buckets directories under ``workdir/buckets``. ``tls`` (certificate,
    key) makes it HTTPS-only. ``start()`` returns once it refuses an anonymous request."""

    runtime: S3Proxy
    workdir: Path
    credentials: S3Credentials = field(default_factory=S3Credentials.generate)
    tls: tuple[Path, Path] | None = None
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (AWS_ENDPOINT_URL)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def buckets(self) -> Path:
        return self.workdir / "buckets"

    @property
    def log(self) -> Path:
        return self.workdir / "s3proxy.log"

    def create_bucket(self, name: str) -> None:
        (self.buckets / name).mkdir(mode=0o700, parents=True, exist_ok=True)

    def _keystore(self, password: str) -> Path:
        """The certificate and key as the PKCS#12 keystore Jetty reads."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.hazmat.primitives.serialization import pkcs12

        assert self.tls is not None
        cert = x509.load_pem_x509_certificate(self.tls[0].read_bytes())
        key = serialization.load_pem_private_key(self.tls[1].read_bytes(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
            raise ObjectStoreError(f"{self.tls[1]}: an RSA or EC key is needed for the store's TLS, not {type(key)}")
        encryption = serialization.BestAvailableEncryption(password.encode())
        path = self.workdir / "tls.p12"
        _private_file(path, pkcs12.serialize_key_and_certificates(b"s3proxy", key, cert, None, encryption))
        return path

    def properties(self) -> Path:
        """S3Proxy's configuration (0600: it holds the secret key and the keystore's password)."""
        self.buckets.mkdir(parents=True, exist_ok=True)
        listen = f"{self.host}:{self.port}"
        lines = {
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.credentials.access_key,
            "s3proxy.credential": self.credentials.secret_key,
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(self.buckets),
        }
        if self.tls:
            password = secrets.token_urlsafe(24)
            lines |= {"s3proxy.secure-endpoint": f"https://{listen}", "s3proxy.keystore-path": str(self._keystore(
                password)), "s3proxy.keystore-password": password}  # fmt: skip
        else:
            lines["s3proxy.endpoint"] = f"http://{listen}"
        path = self.workdir / "s3proxy.conf"
        _private_file(path, "".join(f"{key}={value}\n" for key, value in lines.items()).encode())
        return path

    def command(self) -> list[str]:
        return self.runtime.argv(self.properties())

    def answers(self, ca: Path | None = None) -> bool:
        """Whether the store serves S3 (403 to an anonymous request is the healthy answer)."""
        import ssl

        context = ssl.create_default_context(cafile=str(ca)) if ca else None
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2, context=context):
                return False  # a 2xx to an anonymous client: authorization is off
        except urllib.error.HTTPError as exc:
            return exc.code == 403
        except OSError:
            return False

    def start(self, *, ca: Path | None = None, timeout_s: float = 60.0) -> ObjectStore:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ObjectStoreError(f"S3Proxy exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if self.answers(ca):
                return self
            time.sleep(0.3)
        self.stop()
        raise ObjectStoreError(f"S3Proxy did not answer on {self.endpoint} within {timeout_s:.0f}s: {self.log}")

    def stop(self) -> None:
        stop_child(self.proc, grace_s=SHUTDOWN_GRACE_S)
        self.proc = None


CLUSTER_STORE_FILE = "objectstore.json"


@dataclass(frozen=True)
class ClusterObjectStore:
    """The development cluster's object store as the e2e suite and users reach it: an S3 endpoint on the node's
    bridge address (pods reach it; nothing off the host does), the cluster CA that signed its certificate, the
    one access key it knows and the directory its buckets are. Saved 0600 under the cluster's root: the secret key
    is a secret."""

    endpoint: str
    ca: Path
    credentials: S3Credentials
    buckets: Path

    def save(self, directory: Path) -> None:
        data = {"endpoint": self.endpoint, "ca": str(self.ca), "access_key": self.credentials.access_key,
                "secret_key": self.credentials.secret_key, "buckets": str(self.buckets)}  # fmt: skip
        _private_file(directory / CLUSTER_STORE_FILE, json.dumps(data, indent=1).encode())

    @classmethod
    def load(cls, directory: Path) -> ClusterObjectStore | None:
        path = directory / CLUSTER_STORE_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        credentials = S3Credentials(data["access_key"], data["secret_key"])
        return cls(data["endpoint"], Path(data["ca"]), credentials, Path(data["buckets"]))

    def secret_keys(self) -> dict[str, str]:
        """What a policy's credentials Secret holds to read this store (agent/object_store.py's key names)."""
        return {
            "AWS_ACCESS_KEY_ID": self.credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "ca.crt": self.ca.read_text(),
        }

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Upload ``data`` to ``s3://bucket/key`` (the bucket made first if missing); returns that URI."""
        import obstore
        from obstore.store import S3Store

        (self.buckets / bucket).mkdir(mode=0o700, parents=True, exist_ok=True)
        store = S3Store(
            bucket, endpoint=self.endpoint, access_key_id=self.credentials.access_key,
            secret_access_key=self.credentials.secret_key, region="us-east-1",
            client_options={"root_certificate": self.ca.read_text()},
        )  # fmt: skip
        obstore.put(store, key, data)
        return f"s3://{bucket}/{key}"


if __name__ == "__main__":
    try:
        print(provide(lambda message: print(message, file=sys.stderr)).jar)
    except (AssetError, apt.AptError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
