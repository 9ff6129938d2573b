"""A smoke run of `kvtb bench storage` with tiny sizes (the benchmark itself is not a test)."""
import json

import pytest

from bench import storage


@pytest.mark.slow
def test_bench_prints_one_json_object_with_the_ratios(capsys, tmp_path):
    assert storage.main(["--json", "--out", str(tmp_path), "--sizes", "4096,65536", "--total-mib", "1",
                         "--rounds", "1", "--concurrency", "2", "--budget-s", "0.1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads((tmp_path / "results.json").read_text())
    assert set(result["results"]["sizes"]) == {"4096", "65536"}
    assert set(result["ratios"]) == {"store_vs_limit", "retrieve_vs_limit"}
    assert all(v > 0 for v in result["ratios"].values())
    row = result["results"]["sizes"]["65536"]
    assert set(row["raw_limits_bytes_per_s"]) == {"zmq_tcp", "pwrite_fsync", "pread_cached"}
    assert all(v > 0 for v in row["raw_limits_bytes_per_s"].values())
    assert set(row["threads_bytes_per_s"]) == {"pwrite_fsync_threads", "pread_cached_threads"}
    assert row["store_vs_limit"] == pytest.approx(row["store_bytes_per_s"] / row["store_limit_bytes_per_s"])
    assert "store/limit" in storage.table(result)
