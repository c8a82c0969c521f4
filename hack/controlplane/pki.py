"""Certificates and keys for a throwaway control plane.

One CA signs the API server's serving certificate and an admin client
certificate in ``system:masters`` (so RBAC lets it do anything), and a separate
key signs service-account tokens. ECDSA P-256 keeps generation instant.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

try:
    from cryptography import x509
except ImportError:  # a venv made before cryptography joined the dev extra
    from hack.controlplane.assets import pip_install
    from hack.controlplane.versions import CRYPTOGRAPHY_PYPI

    pip_install(CRYPTOGRAPHY_PYPI)
    from cryptography import x509

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_IP = "10.0.0.1"  # first address of --service-cluster-ip-range=10.0.0.0/24


@dataclass(frozen=True)
class Pki:
    """Paths of the generated PEM files."""

    ca_cert: Path
    ca_key: Path  # signs what joins the cluster later (the registry's serving certificate)
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    # Client certificates of the node's components, by component name: each has its Kubernetes identity
    # (the kubelet is system:node:<name> in system:nodes, for the Node authorizer).
    clients: dict[str, tuple[Path, Path]] = field(default_factory=dict)


# Component -> (common name, organization) of its client certificate.
NodeIdentities = dict[str, tuple[str, str | None]]


def generate(
    directory: Path,
    *,
    valid_days: int = 30,
    extra_ips: tuple[str, ...] = (),
    clients: NodeIdentities | None = None,
) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=valid_days)

    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metainfer-dev-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = _key()
    sans: list[x509.GeneralName] = [
        x509.DNSName(name) for name in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1", SERVICE_IP, *extra_ips)]
    serving = (
        _builder(_name("kube-apiserver"), ca_name, serving_key.public_key(), now, until)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    admin_key = _key()
    admin = (
        _builder(_name("metainfer-admin", "system:masters"), ca_name, admin_key.public_key(), now, until)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    issued: dict[str, tuple[Path, Path]] = {}
    for component, (common_name, organization) in (clients or {}).items():
        client_key = _key()
        client = (
            _builder(_name(common_name, organization), ca_name, client_key.public_key(), now, until)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert_path, key_path = directory / f"{component}.crt", directory / f"{component}.key"
        _write(cert_path, client.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _private_pem(client_key))
        issued[component] = (cert_path, key_path)

    sa_key = _key()
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        clients=issued,
    )
    _write(pki.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(pki.ca_key, _private_pem(ca_key))
    _write(pki.serving_cert, serving.public_bytes(serialization.Encoding.PEM))
    _write(pki.serving_key, _private_pem(serving_key))
    _write(pki.admin_cert, admin.public_bytes(serialization.Encoding.PEM))
    _write(pki.admin_key, _private_pem(admin_key))
    _write(pki.sa_key, _private_pem(sa_key))
    _write(
        pki.sa_pub,
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )
    return pki


def issue_serving(
    ca_cert: Path, ca_key: Path, out: Path, common_name: str, *, ips: tuple[str, ...], dns: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """A serving certificate signed by the cluster's CA for ``ips``/``dns``: ``out``.crt and ``out``.key."""
    issuer = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca_key} is not the EC key this module writes")
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        _builder(_name(common_name), issuer.subject, key.public_key(), now, issuer.not_valid_after_utc)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(signer, hashes.SHA256())
    )
    cert_path, key_path = out.with_suffix(".crt"), out.with_suffix(".key")
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    _write(key_path, _private_pem(key))
    return cert_path, key_path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)
