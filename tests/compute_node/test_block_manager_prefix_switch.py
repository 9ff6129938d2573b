"""The block manager's prefix-cache switch: off, nothing is ever found, so a preempted sequence recomputes
everything it lost (the poster study runs so); on, its own freed blocks are found again (pure)."""
from __future__ import annotations

from compute_node.block_manager import BlockManager
from compute_node.sequence import Sequence
from compute_node.settings import ComputeSettings

BT = 4


def _preempted_and_back(bm: BlockManager) -> Sequence:
    s = Sequence(list(range(100, 113)), max_new_tokens=4, block_tokens=BT, salt=b"a")
    bm.allocate(s)
    bm.mark_computed(s, len(s) - 1)  # 12 tokens computed: 3 full blocks get hashes
    bm.deallocate(s)                 # preempted by recompute
    bm.allocate(s)                   # resumed
    return s


def test_on_a_resumed_sequence_finds_its_own_freed_blocks():
    bm = BlockManager(8, BT)
    s = _preempted_and_back(bm)
    assert s.num_computed_tokens == 12 and bm.prefix_cache_hits == 12


def test_off_nothing_is_found_and_everything_is_computed_again():
    bm = BlockManager(8, BT, prefix_cache=False)
    s = _preempted_and_back(bm)
    assert s.num_computed_tokens == 0 and bm.prefix_cache_hits == 0
    assert len(s.block_table) == s.num_blocks and bm.can_allocate(Sequence([1] * 5, 1, BT, salt=b"a"))


def test_the_setting_is_on_by_default_and_read_as_a_boolean():
    assert ComputeSettings().prefix_cache is True
    assert ComputeSettings(prefix_cache=False).prefix_cache is False
