"""The frontend's replica and routing settings: the default single replica, entries, their checks."""
import pytest

from chat_frontend.settings import MAX_REPLICAS, FrontendSettings, ReplicaAddress, load
from kvtb.settings import SettingsError


def test_no_replicas_is_one_at_agent_address_as_smartnic():
    s = FrontendSettings(agent_address="127.0.0.1:6000")
    assert s.replica_addresses() == [ReplicaAddress("replica-0", "127.0.0.1:6000", "smartnic")]
    assert (s.routing, s.health_interval_s, s.health_timeout_s) == ("kv_aware", 1.0, 2.0)


def test_replicas_from_the_environment_as_a_list(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTB_FRONTEND_REPLICAS",
                       "replica-0=127.0.0.1:50051=smartnic, replica-1=127.0.0.1:50053=smartnic-1")
    monkeypatch.setenv("KVTB_FRONTEND_ROUTING", "least_loaded")
    s = load(None)
    assert s.routing == "least_loaded"
    assert s.replica_addresses() == [ReplicaAddress("replica-0", "127.0.0.1:50051", "smartnic"),
                                     ReplicaAddress("replica-1", "127.0.0.1:50053", "smartnic-1")]


@pytest.mark.parametrize("settings, message", [
    ({"replicas": ("replica-1=127.0.0.1:50053",)}, "'replica-1=127.0.0.1:50053' is not NAME=ADDRESS=IDENTITY"),
    ({"replicas": ("replica-1=localhost=smartnic-1",)}, "the address 'localhost' is not HOST:PORT"),
    ({"replicas": ("a b=127.0.0.1:1=smartnic",)}, "the name 'a b' must be"),
    ({"replicas": ("r=127.0.0.1:1=smartnic", "r=127.0.0.1:2=smartnic-1")}, "names must be unique; repeated: ['r']"),
    ({"replicas": tuple(f"r{i}=127.0.0.1:{i + 1}=s" for i in range(MAX_REPLICAS + 1))}, "at most 64"),
    ({"routing": "random"}, "routing must be one of round_robin, least_loaded, kv_aware"),
    ({"health_interval_s": 0}, "health_interval_s"),
    ({"health_timeout_s": -1.0}, "health_timeout_s"),
    ({"balance_abs_threshold": -1}, "balance_abs_threshold"),
    ({"users": {"a": "t"}, "metrics_readers": ("prometheus",)},
     "metrics_readers names users that are not in users: ['prometheus']"),
])
def test_a_bad_setting_is_a_clear_error(settings, message):
    with pytest.raises(SettingsError) as err:
        FrontendSettings(**settings)
    assert message in str(err.value)


def test_an_explicit_agent_is_the_only_replica(monkeypatch):
    monkeypatch.setenv("KVTB_FRONTEND_REPLICAS", "replica-0=127.0.0.1:1=smartnic,replica-1=127.0.0.1:2=smartnic-1")
    s = load(None, agent_address="127.0.0.1:7", replicas=())  # as `kvtb serve frontend --agent` loads them
    assert s.replica_addresses() == [ReplicaAddress("replica-0", "127.0.0.1:7", "smartnic")]
    assert len(load(None).replica_addresses()) == 2
