"""kvtb.credentials for replicas: each replica's identities and fabric hosts, and their certificates."""
from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from kvtb import credentials


def common_name(path) -> str:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def test_replica_zero_keeps_the_single_replica_names():
    assert credentials.replica_identities(0) == ("smartnic", "compute")
    assert credentials.replica_nqns(0) == (credentials.AGENT_NQN, credentials.COMPUTE_NQN)


def test_replica_i_has_identities_and_hosts_of_its_own():
    assert credentials.replica_identities(1) == ("smartnic-1", "compute-1")
    assert credentials.replica_nqns(7) == ("nqn.2026-11.org.kvtestbed:smartnic-7", "nqn.2026-11.org.kvtestbed:compute-7")
    for bad in (-1, 8, True, "1"):
        with pytest.raises(ValueError, match="replica index"):
            credentials.replica_identities(bad)


def test_deployment_identities_add_each_further_replicas():
    assert credentials.deployment_identities() == credentials.IDENTITIES
    assert credentials.deployment_identities(3)[-4:] == ("smartnic-1", "compute-1", "smartnic-2", "compute-2")
    with pytest.raises(ValueError, match="replicas must be a whole number 1 .. 8"):
        credentials.deployment_identities(9)


def test_init_makes_a_certificate_per_replica_identity(tmp_path):
    d = credentials.init(tmp_path / "c", credentials.deployment_identities(2))
    for identity in ("smartnic", "compute", "smartnic-1", "compute-1"):
        assert common_name(d / f"{identity}.crt") == identity
        assert (d / f"{identity}.key").stat().st_mode & 0o777 == 0o600
    ca = (d / "ca.crt").read_bytes()
    credentials.init(d, credentials.deployment_identities(3))  # more replicas later: same CA, new identities
    assert (d / "ca.crt").read_bytes() == ca and common_name(d / "compute-2.crt") == "compute-2"


def test_the_command_makes_the_replicas_credentials(tmp_path, capsys):
    assert credentials.main(["init", str(tmp_path / "c"), "--replicas", "2"]) == 0
    assert common_name(tmp_path / "c" / "smartnic-1.crt") == "smartnic-1"
    assert not (tmp_path / "c" / "smartnic-2.crt").exists()
    with pytest.raises(SystemExit):
        credentials.main(["init", str(tmp_path / "d"), "--replicas", "9"])
