"""bench.kv_dtype: the comparison of replies across KV dtypes (pure), and the bench on a tiny model."""
from __future__ import annotations

import json

import pytest

from bench import kv_dtype as kd
from bench.study.tiny_model import make_tiny_model


def run_of(chat: list[list[int]], capitals: list[str], kv_bytes: int = 4) -> dict:
    return {"chat": [{"ids": ids, "text": ""} for ids in chat],
            "capitals": [{"ids": [], "text": t, "match": t.strip().lower() == "paris"} for t in capitals],
            "kv_bytes_per_token": kv_bytes}


def test_the_comparison_counts_identical_replies_and_where_the_first_difference_lies():
    runs = {"float32": run_of([[1, 2, 3], [4, 5]], [" Paris", " Rome"]),
            "bfloat16": run_of([[1, 2, 3], [4, 6]], [" Paris", " Milan"], 2),
            "float8_e4m3fn": run_of([[1, 9], [4, 5]], [" Paris", " Rome"], 1)}
    got = kd.compare(runs)
    assert got["float32"]["equal_to_base_everywhere"] and got["float32"]["chat_identical"] == 1.0
    b = got["bfloat16"]
    assert (b["chat_identical"], b["chat_first_differing_turn"], b["chat_first_differing_token"]) == (0.5, 1, 1)
    assert b["capitals_identical"] == 0.5 and b["capitals_exact_match"] == 0.5 and not b["equal_to_base_everywhere"]
    f = got["float8_e4m3fn"]
    assert (f["chat_first_differing_turn"], f["chat_first_differing_token"], f["kv_bytes_per_token"]) == (0, 1, 1)
    assert kd.first_difference([1, 2], [1, 2, 3]) == 2 and kd.first_difference([1], [1]) is None


def test_the_tasks_filter_takes_the_first_word():
    assert kd.first_word("  Paris, of course") == "paris" and kd.first_word(" ...") == ""


@pytest.mark.service  # its report's machine record asks git for the commit
def test_the_bench_runs_every_dtype_on_a_tiny_model(tmp_path, capsys):
    cache = make_tiny_model(tmp_path / "tiny")
    assert kd.main(["--cache", str(cache), "--max-new-tokens", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["compare"]) == set(kd.DTYPES)
    assert report["compare"]["float32"]["equal_to_base_everywhere"]
    sizes = [report["compare"][d]["kv_bytes_per_token"] for d in kd.DTYPES]
    assert sizes[0] == 2 * sizes[1] == 4 * sizes[2] > 0
    assert all(len(r["chat"]) == len(kd.chat_messages()) and len(r["capitals"]) == len(kd.CAPITALS)
               for r in report["runs"].values())
