"""The frontend's /metrics families: the replicas' (in the rotation, turns served, turns retried)."""
from chat_frontend.metrics import Tenants, families

FIGURES = {"turns_active": 1, "turns_waiting": 0, "rejected_busy": 0, "contexts": 2}


def samples(replicas=None) -> dict:
    out = {}
    for family in families(Tenants(), lambda: FIGURES, replicas):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_each_replica_up_and_its_turns_and_the_retries():
    got = samples(lambda: {"up": {"replica-0": 1, "replica-1": 0}, "turns": {"replica-0": 5, "replica-1": 2},
                           "retries": 1})
    assert got[("kvtb:replica_up", (("replica", "replica-0"),))] == 1
    assert got[("kvtb:replica_up", (("replica", "replica-1"),))] == 0
    assert got[("kvtb:replica_turns_total", (("replica", "replica-0"),))] == 5
    assert got[("kvtb:replica_turns_total", (("replica", "replica-1"),))] == 2
    assert got[("kvtb:replica_retries_total", ())] == 1


def test_without_replicas_no_replica_families():
    assert not any(name.startswith("kvtb:replica") for name, _ in samples())
