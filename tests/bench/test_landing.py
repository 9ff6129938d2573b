"""`kvtb bench landing` lands a context with both landings side by side and reports what it measured."""
import json

import pytest

from bench import landing
from hostmem import dma


@pytest.mark.service  # the report's machine record asks git for the commit
def test_smoke_run_lands_every_block_with_each_landing(tmp_path):
    assert landing.main(["--smoke", "--json", "--out", str(tmp_path), "--kv-dtypes", "bfloat16"]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["results"]["rows"]
    compiled = dma.ENGINE == "compiled" and dma._lander is not None
    assert [r["engine"] for r in rows] == ["numpy", "compiled"] if compiled else ["numpy"]
    assert all(r["blocks"] == 4 and r["mb_per_s"] > 0 and r["wake_late_us"]["n"] > 0 for r in rows)
    if compiled:
        assert {"compiled_vs_python_speed_bfloat16", "wake_late_p99_python_vs_compiled_bfloat16"} <= set(result["ratios"])
    copies = result["results"]["first_copy_gb_per_s"]
    assert {"unused", "used_by_creator"} <= set(copies) and all(v > 0 for v in copies.values())


@pytest.mark.parametrize("engine", ["numpy", "compiled"])
def test_a_context_whose_bytes_were_damaged_fails_loudly(engine):
    if engine == "compiled" and dma._lander is None:
        pytest.skip("hostmem._lander was not built")
    context = landing.Context(64, 32, "float32", 4)
    damaged = bytearray(context.streams[-1])  # the last group's ranges as the node sends them
    damaged[-1] ^= 1  # the last block's last KV byte
    context.streams[-1] = bytes(damaged)
    with pytest.raises(RuntimeError, match="1 blocks failed to land: mac_mismatch"):
        context.land(engine)


def test_bad_arguments_are_refused():
    for argv in (["--tokens", "8"], ["--layer-groups", "31"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            landing.parse_args(argv)
