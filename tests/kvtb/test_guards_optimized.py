"""The checks of the shared packages and the services' settings hold under `python -O` (which drops every
assert): kvtb, hostmem, smartnic's policies and the compute node's and agent's settings each refuse what
they guard against with a real error."""
from __future__ import annotations

import pytest

from tests.optimized import run_optimized

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

CHECKS = """
    import numpy as np
    from compute_node.settings import ComputeSettings
    from hostmem import descriptor  # its layout check runs at import
    from hostmem.block_hash import Salts
    from hostmem.kv_layout import KvLayout
    from smartnic.admission import Admission
    from smartnic.eviction import IdleTimer, LruCapacity
    from smartnic.settings import SmartNicSettings
    from smartnic.standing import StandingPuts
    from smartnic.triggered import DeferredWorkQueue
    from kvtb.launch import ServiceProcess

    assert False, "not optimized"  # skipped under -O: proves the flag took

    def refused(make):
        try:
            make()
        except (ValueError, RuntimeError) as exc:
            return type(exc).__name__
        return "taken"

    class Unstrided(KvLayout):
        def put_trigger(self, block):
            return block

    layout = dict(num_blocks=4, num_layers=2, num_kv_heads=1, block_tokens=8, head_dim=4)
    node = "s0=127.0.0.1:1=tcp://127.0.0.1:2"
    cases = {
        "compute policy": lambda: ComputeSettings(policy="sometimes"),
        "compute block_tokens": lambda: ComputeSettings(block_tokens=0),
        "compute node_name": lambda: ComputeSettings(node_name="a/b"),
        "compute max_num_seqs": lambda: ComputeSettings(max_num_seqs=0),
        "agent salt": lambda: SmartNicSettings(storage_nodes=node, salt=""),
        "agent storage node": lambda: SmartNicSettings(storage_nodes="s0=a=b=c"),
        "agent watermarks": lambda: SmartNicSettings(storage_nodes=node, capacity_low_bytes=2, capacity_high_bytes=1),
        "agent timeouts": lambda: SmartNicSettings(storage_nodes=node, ttl_s=0),
        "layout blocks": lambda: KvLayout(**{**layout, "num_blocks": 0}),
        "layout groups": lambda: KvLayout(**layout, layer_groups=3),
        "layout extra counter": lambda: KvLayout(**layout).extra_counter(8),
        "salts": lambda: Salts(b"p", b"", 2),
        "admission mode": lambda: Admission("sometimes"),
        "admission names": lambda: Admission("on_reuse", max_names=0),
        "lru watermarks": lambda: LruCapacity(1, 2),
        "idle ttl": lambda: IdleTimer(0),
        "queue bound": lambda: DeferredWorkQueue(0),
        "standing triggers": lambda: StandingPuts(Unstrided(**layout), np.zeros((64, 2), dtype=np.uint64)),
        "unstarted read": lambda: ServiceProcess("x", [], "/dev/null")._read_stdout(),
    }
    for name, make in cases.items():
        print(f"{name}: {refused(make)}")
"""


def test_the_guards_raise_under_python_O():
    results = dict(line.split(": ") for line in run_optimized(CHECKS).splitlines())
    assert len(results) == 19
    assert {name: how for name, how in results.items() if how == "taken"} == {}
