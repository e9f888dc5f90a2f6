"""A development certificate authority and one certificate per identity (``cryptography``).

``python -m pointers certs DIR alice bob carol --client client`` writes::

    DIR/ca.pem  DIR/ca.key            the CA (keep ca.key off the workers in production)
    DIR/<id>.pem  DIR/<id>.key        one certificate + private key per identity

Each identity's certificate names it in the subject CN and as a DNS name in the
subjectAltName, and is valid for ``localhost``/``127.0.0.1`` too. Its subjectAltName also
carries its role, the URI ``role:party`` (a worker: serves, and delivers to its peers) or
``role:client`` (runs commands): a served worker tells the two apart by the certificate,
never by the name. The key usages follow the role: a party certificate serves and dials
(extended key usages serverAuth and clientAuth), a client certificate only dials
(clientAuth), so it cannot act as a TLS server. A party certificate also names
``<id>.party.pointers.invalid`` (:func:`party_name`, a name under the reserved
``.invalid`` domain that no host has): whoever dials a worker (a client, or a worker
delivering to its peer) asks TLS for that name, so every connection, reconnections
included, reaches only the party certificate of that identity.
Running the command again with the same DIR reuses the CA, so
identities can be added later. Keys are ECDSA P-256, written with mode 0600.
"""

from __future__ import annotations

import datetime
import functools
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
PARTY, CLIENT = "party", "client"
ROLE_URI = "role:"  # SAN URI prefix: role:party or role:client
PARTY_NAME_SUFFIX = ".party.pointers.invalid"  # a party certificate's role-bound DNS name
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
    clients: Iterable[str] = (),
    days: int = 365,
    hosts: Iterable[str] = DEFAULT_HOSTS,
) -> list[Path]:
    """Create (or reuse) the CA in ``directory`` and issue one certificate per identity.

    ``identities`` are parties (workers: role ``party``), ``clients`` run commands (role
    ``client``); a name may not be both. ``hosts`` are extra DNS names or IP addresses every certificate is valid for, so a
    client may also dial a worker by one of them. Returns the files written.
    """
    roles = {check_identity(i): PARTY for i in identities}
    for c in clients:
        if roles.get(check_identity(c)) == PARTY:
            raise ValueError(f"{c!r} cannot be both a party and a client")
        roles[c] = CLIENT
    if not roles:
        raise ValueError("name at least one identity, e.g. alice bob carol --client client")
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
    for h in host_list:  # a host name may not stand in for a party's role-bound name
        if h.lower().rstrip(".").endswith(PARTY_NAME_SUFFIX):
            raise ValueError(f"host {h!r} may not end with {PARTY_NAME_SUFFIX!r}")
    for identity, role in roles.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _identity_certificate(identity, key, ca_cert, ca_key, days, host_list, role)
        _write_key(d / f"{identity}.key", key)
        (d / f"{identity}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        written += [d / f"{identity}.pem", d / f"{identity}.key"]
    return written


def certificate_identity(pem: bytes) -> str:
    """The identity (subject CN) a PEM certificate names (any text; see
    :func:`certificate_role` for the checked identity and role)."""
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError("the certificate has no common name")
    value = names[0].value
    return value if isinstance(value, str) else value.decode()


def party_name(identity: str) -> str:
    """The DNS name only the party certificate of ``identity`` carries: a channel to a
    worker asks TLS for it (``ssl_target_name_override``), so the TLS handshake fails
    unless the worker presents the party certificate of that identity."""
    return check_identity(identity) + PARTY_NAME_SUFFIX


def check_party_certificate(pem: bytes, identity: str) -> None:
    """Raise ValueError unless ``pem`` is the party certificate of ``identity``: role
    ``role:party``, CN ``identity``, and the DNS name :func:`party_name` (a certificate
    issued before roles were bound to names lacks it: issue it again)."""
    who, role = certificate_role(pem)
    if role != PARTY:
        raise ValueError(f"it presented a {role} certificate (of {who!r}), not a party certificate")
    if who != identity:
        raise ValueError(f"it presented the party certificate of {who!r}, not of {identity!r}")
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    if party_name(identity) not in dns:
        raise ValueError(
            f"the party certificate of {identity!r} predates role-bound certificates (it "
            f"lacks the name {party_name(identity)!r}); issue it again with `python -m "
            f"pointers certs DIR {identity}`"
        )


@functools.lru_cache(maxsize=256)
def certificate_role(pem: bytes) -> tuple[str, str]:
    """``(identity, role)`` of a peer's PEM certificate, both checked: exactly one CN, a
    well-formed identity (:func:`check_identity`) and exactly one role URI in the
    subjectAltName (``role:party`` or ``role:client``). Raises ValueError otherwise."""
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise ValueError(f"a certificate names exactly one identity (CN), this one {len(names)}")
    value = names[0].value
    identity = value if isinstance(value, str) else value.decode(errors="replace")
    check_identity(identity)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    roles = {u[len(ROLE_URI) :] for u in uris if u.startswith(ROLE_URI)}
    if len(roles) != 1 or not roles <= {PARTY, CLIENT}:
        raise ValueError(
            f"the certificate of {identity!r} must carry exactly one role (a subjectAltName "
            f"URI role:party or role:client), it has {sorted(roles) or 'none'}; issue it again "
            "with `python -m pointers certs` (parties as names, clients with --client)"
        )
    return identity, roles.pop()


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
    role: str,
) -> x509.Certificate:
    now = _now()
    alt: list[x509.GeneralName] = [
        x509.DNSName(identity),
        x509.UniformResourceIdentifier(ROLE_URI + role),
    ]
    if role == PARTY:  # the name a dialer asks TLS for (see party_name)
        alt.append(x509.DNSName(party_name(identity)))
    # the key usages of the role: only a party serves (a client certificate cannot act as
    # a TLS server, so a client cannot stand in for a worker's peer)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == PARTY:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
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
            x509.ExtendedKeyUsage(usages),
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
