"""`kvtb bench attention` runs and reports both paths side by side (its numbers are what it measured)."""
import json

import pytest

from bench import attention
from compute_node.paged_attention import kernel_built

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_smoke_run_reports_every_context_and_chunk(tmp_path, capsys):
    if not kernel_built():
        pytest.skip("the attention kernel was not built")
    assert attention.main(["--smoke", "--json", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["results"]["rows"]
    assert [(r["context"], r["chunk"]) for r in rows] == [(96, 1), (96, 4)]
    assert all(r["kernel_ms"] > 0 and r["torch_ms"] > 0 for r in rows)
    assert set(result["ratios"]) == {"kernel_vs_torch_96_1", "kernel_vs_torch_96_4"}


def test_a_chunk_longer_than_a_context_is_refused():
    with pytest.raises(SystemExit):
        attention.parse_args(["--contexts", "8", "--chunks", "16"])
