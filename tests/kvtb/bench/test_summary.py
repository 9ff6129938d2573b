"""The headline table of `kvtb bench all` and its splice into the README (pure)."""
from __future__ import annotations

import pytest

from kvtb.bench import summary

RESULTS = {
    "ttft": {"ratios": {"recompute_vs_restore_2048": 31.24, "restore_vs_resident_2048": 1.21},
             "results": {"crossover": {"tokens": None, "where": "below_smallest", "smallest": 32}}},
    "datapath": {"ratios": {"put_vs_limit": 0.61, "get_vs_limit": 0.75}},
    "concurrency": {"ratios": {"tokens_per_s_8_vs_1": 1.5, "ttft_p50_8_vs_1": 4.0}},
    "eviction": {"settings": {"fractions": [1.0, 0.25], "policies": ["lru", "timer"]},
                 "results": {"runs": {"lru_0.25": {"hit_rate": 0.4}, "timer_0.25": {"hit_rate": 0.3}}}},
}


def test_rows_show_what_ran_with_its_target():
    rows = summary.rows(RESULTS)
    shown = {q: v for q, v, _, _ in rows}
    assert shown["Follow-up TTFT, recomputed / restored, 2,048-token context"] == "31.2x"
    assert shown["Context under which recomputing is as fast as restoring"] == "below 32 tokens"
    assert shown["Output tokens/s, most sessions / one session"] == "1.50 (8 sessions / 1)"
    assert "lru 0.40, timer 0.30 (capacity 0.25" in shown["Follow-up hit rate under limited storage, by "
                                                         "eviction policy"]
    assert not any("Agent" in q for q in shown)  # smartnic did not run: no row, no made-up value
    assert ("KV PUT through the whole path / raw limit, 16 MiB chunks", "0.61", "floor 0.5",
            "`kvtb bench datapath`") in rows


def test_a_put_and_get_pair_shows_only_when_both_were_measured():
    smartnic = {"ratios": {"bare_put_vs_limit": 0.456, "bare_get_vs_limit": 0.62, "put_vs_bare_path": 0.7}}
    shown = {q: v for q, v, _, _ in summary.rows({"smartnic": smartnic})}
    assert shown["Bare path (the path's work, no services) / raw limit, worst of 1 and 16 MiB"] == \
        "PUT 0.46, GET 0.62"
    assert "Agent / bare path, worst of 1 and 16 MiB chunks" not in shown


def test_table_is_markdown_with_one_line_per_row():
    lines = summary.table(RESULTS).splitlines()
    assert lines[0].startswith("| question |") and len(lines) == 2 + len(summary.rows(RESULTS))


def test_splice_replaces_only_the_block_between_the_markers():
    text = f"intro\n{summary.START}\nold table\n{summary.END}\noutro\n"
    assert summary.splice(text, "new") == f"intro\n{summary.START}\nnew\n{summary.END}\noutro\n"


def test_splice_needs_the_markers():
    with pytest.raises(ValueError, match="block to replace"):
        summary.splice("no markers here", "new")
