"""What `kvtb bench datapath` hands `kvtb simulate --calibrate` (pure)."""
from __future__ import annotations

from bench.datapath import calibration_transfers


def test_calibration_transfers_are_per_chunk_seconds():
    rows = [{"chunk_bytes": 1 << 20, "put_bytes_per_s": 2 ** 21, "get_bytes_per_s": 2 ** 22,
             "storage_node_direct": {"put_bytes_per_s": 2 ** 20, "get_bytes_per_s": 2 ** 23}}]
    got = {(t["mode"], t["direction"]): t["seconds"] for t in calibration_transfers(rows)}
    assert got == {("triggered", "put"): 0.5, ("triggered", "get"): 0.25,
                   ("cpu", "put"): 1.0, ("cpu", "get"): 0.125}
