"""A smoke test of `kvtb bench storage` with tiny sizes (the benchmark itself is not a test)."""
import json

import pytest

from storage_node import bench


@pytest.mark.slow
def test_bench_prints_one_json_object_with_the_ratios(capsys):
    assert bench.main(["--json", "--sizes", "4096,65536", "--total-mib", "1", "--rounds", "1",
                       "--concurrency", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["sizes"]) == {"4096", "65536"}
    assert report["ratios"]["size_bytes"] == 65536
    for name in ("store_vs_limit", "retrieve_vs_limit"):
        assert report["ratios"][name] > 0
    row = report["sizes"]["65536"]
    for limit in ("limit_pwrite_fsync_gbps", "limit_pread_gbps", "limit_zmq_loopback_gbps"):
        assert row[limit] > 0
