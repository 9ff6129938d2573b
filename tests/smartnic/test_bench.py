"""The pure helpers of `kvtb bench smartnic` (its runs are in tests/kvtb/bench/test_smoke.py)."""
from __future__ import annotations

from smartnic.bench import rounds_line


def test_rounds_line_gives_worst_median_and_best_of_each_op():
    t = {"chunk_bytes": 1 << 20,
         "rounds_bytes_per_s": {"put": [3e9, 1e9, 2e9], "get": [4e9, 5e9, 6e9, 7e9]}}
    assert rounds_line(t) == ("1 MiB rounds, MB/s worst / median / best: PUT 1000 / 2000 / 3000, "
                              "GET 4000 / 5500 / 7000")
