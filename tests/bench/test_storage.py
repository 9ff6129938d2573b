"""A smoke run of `kvtb bench storage` with tiny sizes (the benchmark itself is not a test)."""
import json

import pytest

from bench import storage

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


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


@pytest.mark.slow
def test_a_size_that_fails_is_reported_and_the_others_still_run(capsys, tmp_path, monkeypatch):
    real = storage.measure_size

    def measure_size(client, path, size, *args):
        if size == 4096:
            raise TimeoutError("the node did not answer")
        return real(client, path, size, *args)
    monkeypatch.setattr(storage, "measure_size", measure_size)
    assert storage.main(["--json", "--out", str(tmp_path), "--sizes", "4096,65536", "--total-mib", "1",
                         "--rounds", "1", "--concurrency", "2", "--budget-s", "0.1"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["failed"] == [{"part": "4 KiB values", "error": "TimeoutError: the node did not answer"}]
    assert set(result["results"]["sizes"]) == {"65536"} and set(result["ratios"]) == {"store_vs_limit",
                                                                                      "retrieve_vs_limit"}
    assert "failed: TimeoutError: the node did not answer" in storage.table(result)
