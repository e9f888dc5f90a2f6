"""A development certificate authority and one certificate per identity (``cryptography``).

``python -m pointers certs DIR alice bob carol client`` writes::

    DIR/ca.pem  DIR/ca.key            the CA (keep ca.key off the workers in production)
    DIR/<id>.pem  DIR/<id>.key        one certificate + private key per identity

Each identity's certificate names it in the subject CN and as a DNS name in the
subjectAltName, and is valid for ``localhost``/``127.0.0.1`` too; it serves both as a
server certificate (a worker) and as a client certificate (a client, or a worker
delivering to its peers). Running the command again with the same DIR reuses the CA, so
identities can be added later. Keys are ECDSA P-256, written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_IDENTITY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
CA_NAME = "pointers development CA"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def check_identity(identity: str) -> str:
    """An identity is a DNS label: letters, digits and inner hyphens, at most 63 long."""
    if not isinstance(identity, str) or not _IDENTITY.match(identity):
        raise ValueError(
            f"identity {identity!r} must be a DNS label (letters, digits, inner '-', "
            "1 to 63 characters), e.g. 'alice' or 'party-0'"
        )
    return identity


@dataclass(frozen=True)
class Credentials:
    """PEM bytes gRPC needs: the CA certificate, and this identity's certificate and key."""

    identity: str
    ca: bytes
    cert: bytes
    key: bytes


def load_credentials(directory: str | os.PathLike[str], identity: str) -> Credentials:
    """Read ``ca.pem``, ``<identity>.pem`` and ``<identity>.key`` from ``directory``."""
    d = Path(directory)
    check_identity(identity)
    paths = [d / "ca.pem", d / f"{identity}.pem", d / f"{identity}.key"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"missing certificate files {missing}; create them with "
            f"`python -m pointers certs {d} {identity}`"
        )
    ca, cert, key = (p.read_bytes() for p in paths)
    return Credentials(identity, ca, cert, key)


def create_certs(
    directory: str | os.PathLike[str],
    identities: Iterable[str],
    *,
    days: int = 365,
    hosts: Iterable[str] = DEFAULT_HOSTS,
) -> list[Path]:
    """Create (or reuse) the CA in ``directory`` and issue one certificate per identity.

    ``hosts`` are extra DNS names or IP addresses every certificate is valid for, so a
    client may also dial a worker by one of them. Returns the files written.
    """
    ids = [check_identity(i) for i in identities]
    if not ids:
        raise ValueError("name at least one identity, e.g. alice bob carol client")
    if days < 1:
        raise ValueError(f"days must be positive, got {days}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ca_cert_path, ca_key_path = d / "ca.pem", d / "ca.key"
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{ca_key_path} is not an EC private key")
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _ca_certificate(ca_key, days=max(days, 3650))
        _write_key(ca_key_path, ca_key)
        ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        written += [ca_cert_path, ca_key_path]
    host_list = list(hosts)
    for identity in ids:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _identity_certificate(identity, key, ca_cert, ca_key, days, host_list)
        _write_key(d / f"{identity}.key", key)
        (d / f"{identity}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        written += [d / f"{identity}.pem", d / f"{identity}.key"]
    return written


def certificate_identity(pem: bytes) -> str:
    """The identity (subject CN) a PEM certificate names."""
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError("the certificate has no common name")
    value = names[0].value
    return value if isinstance(value, str) else value.decode()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _ca_certificate(key: ec.EllipticCurvePrivateKey, days: int) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _identity_certificate(
    identity: str,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
    hosts: list[str],
) -> x509.Certificate:
    now = _now()
    alt: list[x509.GeneralName] = [x509.DNSName(identity)]
    for h in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            alt.append(x509.DNSName(h))
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
