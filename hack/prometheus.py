"""A real Prometheus for tests: find (or install) the binary and run one on loopback in a temp dir.

Why real: the drift check's job is to read what Prometheus computes from a
histogram (rate windows, bucket interpolation, staleness, "no data" as NaN or
an empty vector); a fake would only echo our own assumptions back.

Where the binary comes from: ``prometheus`` on PATH (or METAINFER_PROMETHEUS_BIN),
else Debian's package when running as root (``apt-get install prometheus``),
else a clear error saying how to get one. Tests fail on that error: a drift
test that silently skips proves nothing.

Usage: ``python hack/prometheus.py`` prints the binary's path (installing it if
needed); ``--kubernetes-sd`` also builds the one with Kubernetes discovery (`make assets` does, before it drops
Go's caches); tests import ``hack.prometheus.find_binary`` and ``PrometheusServer``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hack.controlplane import apt, assets
from hack.controlplane.errors import ControlPlaneError
from hack.controlplane.processes import free_port, stop_child

Log = Callable[[str], None]


class PrometheusUnavailable(RuntimeError):
    """No Prometheus binary and no way to install one here."""


def find_binary(log: Log = lambda _: None, install: bool = True) -> Path:
    """The path of a ``prometheus`` binary; installs Debian's package when root and allowed."""
    explicit = os.environ.get("METAINFER_PROMETHEUS_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise PrometheusUnavailable(f"METAINFER_PROMETHEUS_BIN={explicit} is not an executable file")
        return Path(explicit)
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    if not install:
        raise PrometheusUnavailable("no `prometheus` on PATH")
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise PrometheusUnavailable(
            "no `prometheus` on PATH: install Debian's package (`sudo apt-get install -y prometheus`) "
            "or point METAINFER_PROMETHEUS_BIN at a Prometheus 2.x binary"
        )
    log("installing Debian's prometheus package (apt-get)")
    try:
        apt.install(["prometheus"])
    except apt.AptError as exc:
        raise PrometheusUnavailable(str(exc)) from exc
    found = shutil.which("prometheus")
    if not found:
        raise PrometheusUnavailable("apt-get installed prometheus but no `prometheus` binary is on PATH")
    return Path(found)


# Debian's package is built without Kubernetes service discovery, which the real-node suite needs
# (serving pods found the way docs/real-cluster.md configures a cluster's Prometheus): that one is
# built from the Go module proxy (Prometheus v3.16 is module version v0.316.0) and cached. Prometheus' own build
# tags leave out every other service discovery (the cloud SDKs behind AWS, Azure, GCE, OCI... were most of the
# longest Go build of a cold `make test`); static and file discovery are part of its core and stay.
KUBERNETES_SD_BINARY = assets.GoBinary(
    name="prometheus",
    module="github.com/prometheus/prometheus",
    version="v0.316.0",
    package="github.com/prometheus/prometheus/cmd/prometheus",
    tags=("remove_all_sd", "enable_kubernetes_sd"),
)


def find_binary_with_kubernetes_sd(log: Log = lambda _: None) -> Path:
    """A Prometheus with kubernetes_sd_configs: METAINFER_PROMETHEUS_K8S_BIN, else built with Go and cached."""
    explicit = os.environ.get("METAINFER_PROMETHEUS_K8S_BIN")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise PrometheusUnavailable(f"METAINFER_PROMETHEUS_K8S_BIN={explicit} is not an executable file")
        return Path(explicit)
    version = KUBERNETES_SD_BINARY.version
    directory = assets.cache_root() / "assets" / f"prometheus-{version}"
    binary = directory / "prometheus"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    directory.mkdir(parents=True, exist_ok=True)
    with assets.lock(directory.parent / f"prometheus-{version}.lock"):
        if not binary.is_file():
            assets.build(KUBERNETES_SD_BINARY, directory, log)
    return binary


@dataclass(frozen=True)
class WebSecurity:
    """Prometheus' own web config: TLS with ``cert``/``key`` (signed by ``ca``) and basic auth for one user, as a
    platform's Prometheus may refuse anonymous queries."""

    cert: Path
    key: Path
    ca: Path
    username: str
    password: str

    def config(self) -> dict[str, object]:
        import bcrypt  # the dev extra's: Prometheus reads only bcrypt hashes of basic-auth passwords

        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()
        return {
            "tls_server_config": {"cert_file": str(self.cert), "key_file": str(self.key)},
            "basic_auth_users": {self.username: hashed},
        }

    def authorization(self) -> str:
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


class PrometheusServer:
    """One Prometheus process on 127.0.0.1:<random port>, scraping ``targets`` every ``scrape_interval_s``.

    ``stop()`` and ``start()`` may be called repeatedly (same port and data dir), which is how tests make it
    unreachable and bring it back.
    """

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        targets: Iterable[str],
        scrape_interval_s: float = 1.0,
        job: str = "serving",
        *,
        scrape_configs: list[dict[str, object]] | None = None,
        host: str = "127.0.0.1",
        web: WebSecurity | None = None,
    ) -> None:
        """``scrape_configs`` replace the one static job (e.g. kubernetes_sd on a real node); ``host`` is the
        listen address (the node's address, for the operator pod to query it); ``web``: serve HTTPS with basic
        auth only."""
        self.binary, self.workdir, self.host, self.web = binary, workdir, host, web
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        workdir.mkdir(parents=True, exist_ok=True)
        interval = f"{max(1, int(scrape_interval_s * 1000))}ms"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "scrape_configs": scrape_configs or [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps(config, indent=1))  # JSON is YAML
        self.web_config = workdir / "web.yml"
        if web is not None:
            self.web_config.write_text(json.dumps(web.config(), indent=1))

    @property
    def url(self) -> str:
        return f"{'https' if self.web else 'http'}://{self.host}:{self.port}"

    def _open(self, url: str, data: bytes | None = None, timeout: float = 5) -> Any:  # urlopen's own: Any
        request = urllib.request.Request(url, data=data)
        context = None
        if self.web is not None:
            request.add_header("Authorization", self.web.authorization())
            context = ssl.create_default_context(cafile=str(self.web.ca))
        return urllib.request.urlopen(request, timeout=timeout, context=context)

    @property
    def log(self) -> Path:
        return self.workdir / f"prometheus-{self.starts}.log"

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.starts += 1
        cmd = [
            str(self.binary),
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=1h",
            "--web.enable-lifecycle",
            *([f"--web.config.file={self.web_config}"] if self.web else []),
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusUnavailable(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with self._open(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise PrometheusUnavailable(f"prometheus not ready after {timeout:g}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        stop_child(self.proc)
        self.proc = None

    def query(self, promql: str) -> dict[str, object]:
        """One instant query (for test diagnostics)."""
        data = urllib.parse.urlencode({"query": promql}).encode()
        with self._open(f"{self.url}/api/v1/query", data=data) as resp:
            return dict(json.loads(resp.read()))


if __name__ == "__main__":
    try:
        print(find_binary(lambda m: print(m, file=sys.stderr)))
        if "--kubernetes-sd" in sys.argv[1:]:
            print(find_binary_with_kubernetes_sd(lambda m: print(m, file=sys.stderr)))
    except (PrometheusUnavailable, ControlPlaneError) as exc:  # ControlPlaneError: a failed Go build
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
