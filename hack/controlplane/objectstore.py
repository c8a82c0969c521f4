"""An S3-compatible object store for the tests and the development cluster: SeaweedFS, with credentials.

SeaweedFS (github.com/seaweedfs/seaweedfs, Apache-2.0) is built with Go at a pinned version and cached, like the
control plane and the registry; MinIO, the usual choice, is AGPL and excluded. ``weed server -s3`` runs its
master, volume server, filer and S3 gateway in one process. An identities file gives one access key every right
and nobody else any: an anonymous request gets 403, so every bucket is private, as a company's model bucket is.
With a certificate the gateway also serves HTTPS (a store behind a private CA, as users' often are).

Its go.mod carries replace directives, which Go ignores in a dependency: the wrapper module the build uses
repeats them (``assets.GoBinary.module_replaces``).

    .venv/bin/python -m hack.controlplane.objectstore   # build (or find) the binary and print its path
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from hack.controlplane import assets
from hack.controlplane.errors import AssetError, ControlPlaneError
from hack.controlplane.processes import free_port, stop_child

SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"  # the snapshot the module proxy serves (weed 4.53)
# Throwaway data: no reason to wait out weed's slow HTTPS shutdown (15 s seen; a cluster's weed never exited within
# the 10 s every other process gets) before SIGKILL.
SHUTDOWN_GRACE_S = 3.0
WEED = assets.GoBinary(
    name="weed",
    module="github.com/seaweedfs/seaweedfs",
    version=SEAWEEDFS_VERSION,
    package="github.com/seaweedfs/seaweedfs/weed",
    module_replaces=(("github.com/tyler-smith/go-bip39", "github.com/cosmos/go-bip39 v1.0.0"),),
)


class ObjectStoreError(ControlPlaneError):
    pass


def provide(log: assets.Log = print) -> Path:
    """The ``weed`` binary: ``METAINFER_WEED_BIN``, the cache, or a fresh Go build into the cache."""
    return assets.provide_go_binary(WEED, "METAINFER_WEED_BIN", log)


@dataclass(frozen=True)
class S3Credentials:
    """An access key pair, as AWS SDKs read it (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."""

    access_key: str
    secret_key: str

    @classmethod
    def generate(cls) -> S3Credentials:
        return cls("metainfer-" + secrets.token_hex(6), secrets.token_urlsafe(30))


@dataclass
class ObjectStore:
    """One ``weed server`` with its S3 gateway on ``gateway_host:port`` (default ``host``); data under
    ``workdir``. Master, volume server and filer listen on ``host`` only: their own HTTP APIs take no credentials,
    so only the gateway may face pods. ``tls`` (certificate, key) makes the gateway HTTPS-only. ``start()``
    returns once the gateway refuses an anonymous request."""

    binary: Path
    workdir: Path
    credentials: S3Credentials = field(default_factory=S3Credentials.generate)
    tls: tuple[Path, Path] | None = None
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    gateway_host: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL (AWS_ENDPOINT_URL)."""
        return f"{'https' if self.tls else 'http'}://{self.gateway_host or self.host}:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "weed.log"

    def _identities(self) -> Path:
        identities = {
            "identities": [
                {
                    "name": "owner",
                    "credentials": [
                        {"accessKey": self.credentials.access_key, "secretKey": self.credentials.secret_key}
                    ],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.workdir / "s3-identities.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps(identities))
        return path

    def command(self) -> list[str]:
        """``weed server`` on loopback, every port chosen here (its defaults are fixed ports, and its gRPC ports
        default to HTTP port + 10000, which may not exist), the side services off."""
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        ports = {name: free_port() for name in ("master", "master.grpc", "volume", "volume.grpc", "filer",
                                                "filer.grpc", "s3.grpc")}  # fmt: skip
        gateway = [f"-s3.port.https={self.port}", f"-s3.cert.file={self.tls[0]}", f"-s3.key.file={self.tls[1]}",
                   f"-s3.port={free_port()}"] if self.tls else [f"-s3.port={self.port}"]  # fmt: skip
        return [
            str(self.binary), "server", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master.grpc']}",
            "-master.volumeSizeLimitMB=64", "-volume.max=64",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume.grpc']}",
            "-filer", f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer.grpc']}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-s3", *gateway, f"-s3.ip.bind={self.gateway_host or self.host}",
            f"-s3.port.grpc={ports['s3.grpc']}", f"-s3.config={self._identities()}",
            f"-s3.localSocket={self.workdir / 's3.sock'}", "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]  # fmt: skip

    def answers(self, ca: Path | None = None) -> bool:
        """Whether the gateway serves S3 (403 to an anonymous request is the healthy answer)."""
        import ssl

        context = ssl.create_default_context(cafile=str(ca)) if ca else None
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2, context=context):
                return False  # a 2xx to an anonymous client: the identities did not load
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
                raise ObjectStoreError(f"weed exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if self.answers(ca):
                return self
            time.sleep(0.3)
        self.stop()
        raise ObjectStoreError(f"the S3 gateway did not answer on {self.endpoint} within {timeout_s:.0f}s: {self.log}")

    def stop(self) -> None:
        stop_child(self.proc, grace_s=SHUTDOWN_GRACE_S)
        self.proc = None


CLUSTER_STORE_FILE = "objectstore.json"


@dataclass(frozen=True)
class ClusterObjectStore:
    """The development cluster's object store as the e2e suite and users reach it: an S3 endpoint on the node's
    bridge address (pods reach it; nothing off the host does), the cluster CA that signed its certificate, and the
    one access key it knows. Saved 0600 under the cluster's root: the secret key is a secret."""

    endpoint: str
    ca: Path
    credentials: S3Credentials

    def save(self, directory: Path) -> None:
        path = directory / CLUSTER_STORE_FILE
        data = {"endpoint": self.endpoint, "ca": str(self.ca), "access_key": self.credentials.access_key,
                "secret_key": self.credentials.secret_key}  # fmt: skip
        path.touch(mode=0o600)
        path.write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, directory: Path) -> ClusterObjectStore | None:
        path = directory / CLUSTER_STORE_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        return cls(data["endpoint"], Path(data["ca"]), S3Credentials(data["access_key"], data["secret_key"]))

    def secret_keys(self) -> dict[str, str]:
        """What a policy's credentials Secret holds to read this store (agent/object_store.py's key names)."""
        return {
            "AWS_ACCESS_KEY_ID": self.credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "ca.crt": self.ca.read_text(),
        }

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Upload ``data`` to ``s3://bucket/key``; returns that URI."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(
            bucket, endpoint=self.endpoint, access_key_id=self.credentials.access_key,
            secret_access_key=self.credentials.secret_key, region="us-east-1",
            client_options={"root_certificate": self.ca.read_text()},
            # A volume server still registering with the master answers 500 for a few seconds: wait it out.
            retry_config={"max_retries": 12, "backoff": {"init_backoff": timedelta(seconds=1),
                                                         "max_backoff": timedelta(seconds=5), "base": 2}},
        )  # fmt: skip
        obstore.put(store, key, data)
        return f"s3://{bucket}/{key}"


if __name__ == "__main__":
    try:
        print(provide(lambda message: print(message, file=sys.stderr)))
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
