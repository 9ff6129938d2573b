from __future__ import annotations

import argparse
from pathlib import Path

from kvtb.bench import common


def test_common_args_and_result():
    parser = common.add_common_args(argparse.ArgumentParser(), "datapath")
    args = parser.parse_args(["--json"])
    assert args.json and args.out == Path("out/datapath")
    assert common.progress_for(args, 3, "x").enabled is False
    result = common.new_result("datapath", {"chunk_bytes": 1024})
    assert result["bench"] == "datapath" and result["ratios"] == {} and "cpu_model" in result["machine"]
