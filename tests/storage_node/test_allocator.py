"""The extent allocator: best fit, scattering when fragmented, coalescing frees, full."""
import pytest

from storage_node.allocator import AllocationError, Extent, ExtentAllocator

B = 4096


def test_allocations_are_block_aligned_and_account_for_used_bytes():
    alloc = ExtentAllocator(100 * B)
    assert alloc.allocate(1) == [Extent(0, B)]
    assert alloc.allocate(B + 1) == [Extent(B, 2 * B)]
    assert alloc.used_bytes == 3 * B and alloc.free_bytes == 97 * B


def test_frees_coalesce_with_both_neighbours():
    alloc = ExtentAllocator(10 * B)
    a, b, c = (alloc.allocate(2 * B)[0] for _ in range(3))
    alloc.free([a])
    alloc.free([c])
    alloc.free([b])
    assert alloc.free_extents() == [Extent(0, 10 * B)]


def test_best_fit_picks_the_smallest_hole_that_fits():
    alloc = ExtentAllocator(20 * B)
    exts = [alloc.allocate(B)[0] for _ in range(20)]
    alloc.free([exts[1]])                       # a 1-block hole
    alloc.free([exts[5], exts[6], exts[7]])     # a 3-block hole
    alloc.free([exts[10], exts[11]])            # a 2-block hole
    assert alloc.allocate(2 * B) == [Extent(10 * B, 2 * B)]
    assert alloc.allocate(B) == [Extent(B, B)]


def test_fragmented_space_is_used_by_scattering_over_several_extents():
    alloc = ExtentAllocator(8 * B)
    exts = [alloc.allocate(B)[0] for _ in range(8)]
    alloc.free(exts[0::2])                      # four 1-block holes, none adjacent
    got = alloc.allocate(3 * B)
    assert sum(e.length for e in got) == 3 * B and len(got) == 3
    assert alloc.free_bytes == B


def test_full_raises_and_changes_nothing():
    alloc = ExtentAllocator(4 * B)
    alloc.allocate(3 * B)
    with pytest.raises(AllocationError):
        alloc.allocate(2 * B)
    assert alloc.free_bytes == B
    assert alloc.allocate(B) == [Extent(3 * B, B)]
    with pytest.raises(AllocationError):
        alloc.allocate(1)


def test_double_free_is_refused():
    alloc = ExtentAllocator(4 * B)
    ext = alloc.allocate(B)
    alloc.free(ext)
    with pytest.raises(ValueError):
        alloc.free(ext)


def test_state_round_trips_and_rebuilds_from_used_extents():
    alloc = ExtentAllocator(16 * B)
    kept = [alloc.allocate(B)[0] for _ in range(6)]
    alloc.free(kept[1:4])
    copy = ExtentAllocator.from_state(alloc.to_state())
    assert copy.free_extents() == alloc.free_extents() and copy.free_bytes == alloc.free_bytes
    rebuilt = ExtentAllocator.from_used(16 * B, [kept[0], *kept[4:]])
    assert rebuilt.free_extents() == alloc.free_extents()
    with pytest.raises(ValueError):
        ExtentAllocator.from_used(16 * B, [Extent(0, 2 * B), Extent(B, B)])
