"""The deployment's credentials, made at first start with no manual step (`kvtb credentials init`).

    DIR/ca.crt                the deployment's certificate authority (EC P-256, self-signed)
    DIR/ca.key                its key: only `init` reads it; services never need it
    DIR/IDENTITY.crt, .key    one certificate per identity, signed by the CA; its common name and a
                              DNS name are the identity, plus the DNS name "kvtb" that every service
                              has (for clients that only need *a* service of this deployment)
    DIR/fabric.key            the storage fabric's master secret; the storage nodes hold it, a host
                              holds only its own key, derived from it and its NQN (DH-HMAC-CHAP's
                              per-host secret, NVMe-oF's model)
    DIR/kv-mac.key            the key of every stored chunk's MAC (agents and compute nodes hold it;
                              storage nodes never do, so they cannot forge or move KV)
    DIR/fabric-curve.key      the storage nodes' CURVE key pair (z85 public, newline, z85 secret),
    DIR/fabric-curve.pub      and its public half, which hosts need (`fabric_security: curve`)

Identities: frontend, smartnic, compute, storage (every storage node), operator (the `kvtb`
commands an operator runs: tables, admin, benchmarks, health). With several replicas (an agent and
its compute node each; `kvtb up --replicas N`), replica 0 keeps smartnic and compute and replica i
is smartnic-i and compute-i (`replica_identities`), each with its own certificate. Files are written atomically with
mode 0600 (the directory 0700); an existing file is never replaced, so every service of one
deployment reads the same credentials however many times `init` runs.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import os
import secrets
from pathlib import Path

# The deployment's fabric hosts, as the settings name them by default (the agent and the compute
# node's `cpu` policy): a storage node's default allow list, and the hosts `kvtb up` makes keys for.
NQN_PREFIX = "nqn.2026-11.org.kvtestbed:"
AGENT_NQN = NQN_PREFIX + "smartnic-0"
COMPUTE_NQN = NQN_PREFIX + "compute-0"
MAX_REPLICAS = 8

IDENTITIES = ("frontend", "smartnic", "compute", "storage", "operator")
COMMON_NAME = "kvtb"  # a DNS name of every service certificate
VALID_DAYS = 3650
ENV_DIR = "KVTB_CREDENTIALS_DIR"
DEFAULT_DIR = "var/credentials"


def replica_identities(index: int) -> tuple[str, str]:
    """(agent identity, compute identity) of replica `index`: smartnic and compute for replica 0 (a
    single-replica deployment is as it always was), smartnic-i and compute-i for replica i."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_REPLICAS:
        raise ValueError(f"replica index must be a whole number 0 .. {MAX_REPLICAS - 1}, got {index!r}")
    return ("smartnic", "compute") if index == 0 else (f"smartnic-{index}", f"compute-{index}")


def replica_nqns(index: int) -> tuple[str, str]:
    """(agent host NQN, compute host NQN) of replica `index` on the storage fabric (replica 0's are
    AGENT_NQN and COMPUTE_NQN)."""
    replica_identities(index)  # the same bounds
    return f"{NQN_PREFIX}smartnic-{index}", f"{NQN_PREFIX}compute-{index}"


def deployment_identities(replicas: int = 1) -> tuple[str, ...]:
    """Every identity of a deployment of `replicas` replicas: IDENTITIES, then replica i's for i >= 1."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be a whole number 1 .. {MAX_REPLICAS}, got {replicas!r}")
    return IDENTITIES + tuple(name for i in range(1, replicas) for name in replica_identities(i))


class CredentialsError(RuntimeError):
    """Credentials that are missing or unreadable, with what to do about it."""


def default_dir() -> Path:
    """$KVTB_CREDENTIALS_DIR, else var/credentials under the working directory."""
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


def resolve_dir(setting: str = "") -> Path:
    """A service's `credentials_dir` setting, or the default when it is empty."""
    return Path(setting) if setting else default_dir()


def _write_new(path: Path, data: bytes) -> None:
    """Create path with data (mode 0600), atomically; keep an existing file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process made it first: theirs stays
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def init(directory: str | os.PathLike, identities=IDENTITIES) -> Path:
    """Make whatever credentials are missing in directory (idempotent); return it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name in ("fabric.key", "kv-mac.key"):
        if not (d / name).exists():
            _write_new(d / name, secrets.token_bytes(32))
    if not (d / "fabric-curve.key").exists():
        import zmq
        public, secret = zmq.curve_keypair()
        _write_new(d / "fabric-curve.key", public + b"\n" + secret + b"\n")
    if not (d / "fabric-curve.pub").exists():  # from the pair that won a race, so the two match
        _write_new(d / "fabric-curve.pub", (d / "fabric-curve.key").read_bytes().split(b"\n")[0] + b"\n")
    if not (d / "ca.crt").exists() or not (d / "ca.key").exists():
        key = ec.generate_private_key(ec.SECP256R1())
        _write_new(d / "ca.key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
        _write_new(d / "ca.crt", _certificate("kvtb deployment CA", ca_key.public_key(), ca_key, None, ca=True))
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    ca_cert = _load_cert((d / "ca.crt").read_bytes())
    for identity in identities:
        if (d / f"{identity}.crt").exists() and (d / f"{identity}.key").exists():
            continue
        key = ec.generate_private_key(ec.SECP256R1())
        _write_new(d / f"{identity}.key", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        key = serialization.load_pem_private_key((d / f"{identity}.key").read_bytes(), None)
        _write_new(d / f"{identity}.crt", _certificate(identity, key.public_key(), ca_key, ca_cert))
    return d


def _load_cert(pem: bytes):
    from cryptography import x509
    return x509.load_pem_x509_certificate(pem)


def _certificate(name: str, public_key, signer, issuer_cert, ca: bool = False) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert is not None else subject)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = (builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(name), x509.DNSName(COMMON_NAME)]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@dataclasses.dataclass(frozen=True)
class Credentials:
    """One identity's view of a deployment's credentials directory (read on demand, cached)."""

    directory: Path
    identity: str

    @classmethod
    def load(cls, identity: str, setting: str = "") -> "Credentials":
        """The identity's credentials in `setting` (or the default directory); CredentialsError if absent."""
        creds = cls(resolve_dir(setting), identity)
        creds.tls()  # fail now, with a clear message, rather than at the first connection
        return creds

    def _read(self, name: str) -> bytes:
        path = self.directory / name
        try:
            return path.read_bytes()
        except OSError as exc:
            raise CredentialsError(
                f"cannot read {path} ({exc.strerror}): the deployment's credentials are made by "
                f"`kvtb credentials init {self.directory}` (kvtb up and the containers do it at first start)"
            ) from exc

    def tls(self) -> tuple[bytes, bytes, bytes]:
        """(CA certificate, this identity's certificate, its private key), PEM."""
        return (self._read("ca.crt"), self._read(f"{self.identity}.crt"), self._read(f"{self.identity}.key"))

    def fabric_master(self) -> bytes:
        """The fabric's master secret (storage nodes only)."""
        return self._read("fabric.key")

    def fabric_host_key(self, host_nqn: str) -> bytes:
        """This host's fabric secret: from fabric-host.key if given alone, else derived from the master."""
        own = self.directory / "fabric-host.key"
        if own.exists():
            return own.read_bytes()
        return host_key(self.fabric_master(), host_nqn)

    def fabric_curve_public(self) -> bytes:
        """The storage nodes' CURVE public key (z85, 40 bytes)."""
        return self._read("fabric-curve.pub").strip()

    def fabric_curve_pair(self) -> tuple[bytes, bytes]:
        """The storage nodes' CURVE (public, secret) keys, z85 (storage nodes only)."""
        public, secret = self._read("fabric-curve.key").split()[:2]
        return public, secret

    def kv_mac_key(self) -> bytes:
        """The key of every stored chunk's MAC."""
        return self._read("kv-mac.key")


def host_key(master: bytes, host_nqn: str) -> bytes:
    """A fabric host's secret, derived from the master and its NQN (what the target checks it against)."""
    return hmac.new(master, b"kvtb fabric host key\0" + host_nqn.encode(), hashlib.sha256).digest()


def main(argv: list[str]) -> int:
    """`kvtb credentials init [DIR] [--replicas N]`: make the deployment's credentials (what is missing)."""
    import argparse
    parser = argparse.ArgumentParser(prog="kvtb credentials", description=main.__doc__)
    parser.add_argument("action", choices=["init"])
    parser.add_argument("directory", nargs="?", help=f"default ${ENV_DIR}, else {DEFAULT_DIR}")
    parser.add_argument("--host-key", metavar="NQN",
                        help="also write fabric-host.key for this host NQN (a host's own secret alone)")
    parser.add_argument("--replicas", type=int, default=1, choices=range(1, MAX_REPLICAS + 1), metavar="N",
                        help="also the identities of replicas 1 .. N-1 (smartnic-i, compute-i); default 1")
    args = parser.parse_args(argv)
    d = init(args.directory or default_dir(), deployment_identities(args.replicas))
    if args.host_key:
        _write_new(d / "fabric-host.key", host_key((d / "fabric.key").read_bytes(), args.host_key))
    print(f"credentials in {d}")
    return 0
