"""What `kvtb bench datapath` hands `kvtb simulate --calibrate` (pure)."""
from __future__ import annotations

import pytest

from bench.datapath import calibration_transfers

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_calibration_transfers_are_per_chunk_seconds():
    rows = [{"chunk_bytes": 1 << 20, "put_bytes_per_s": 2 ** 21, "get_bytes_per_s": 2 ** 22,
             "storage_node_direct": {"put_bytes_per_s": 2 ** 20, "get_bytes_per_s": 2 ** 23}}]
    got = {(t["mode"], t["direction"]): t["seconds"] for t in calibration_transfers(rows)}
    assert got == {("triggered", "put"): 0.5, ("triggered", "get"): 0.25,
                   ("cpu", "put"): 1.0, ("cpu", "get"): 0.125}


def test_the_table_says_how_chunks_were_stored_and_what_failed():
    from bench.datapath import table
    from bench.results import new_result
    result = new_result("datapath", {"chunk_format_version": 4, "kv_parts": 30, "ranges_per_chunk": 128})
    result["results"]["chunks"] = []
    result["failed"] = [{"part": "16 MiB chunks", "error": "RuntimeError: GET gave other bytes"}]
    text = table(result)
    assert text.splitlines()[0].startswith("chunks in format v4, 30 KV parts (a MAC each")
    assert "FAILED 16 MiB chunks: RuntimeError: GET gave other bytes" in text
