"""Checks that guard memory and state hold under `python -O` (which drops every assert): the attention
kernel's type and layout guards, and the scheduler's bookkeeping that once sat inside an assert."""
from __future__ import annotations

import pytest

from compute_node import paged_attention
from tests.optimized import run_optimized

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


@pytest.mark.skipif(not paged_attention.kernel_built(), reason="the attention kernel was not built")
def test_the_kernels_guards_raise_under_python_O():
    out = run_optimized("""
        import torch
        from compute_node.paged_attention import KernelTokens
        assert False, "not optimized"  # skipped under -O: proves the flag took
        def refused(make):
            try:
                make()
            except (TypeError, ValueError) as exc:
                return type(exc).__name__
            return "read"
        pool = torch.zeros(4, 1, 2, 1, 4, 8)
        ok = KernelTokens(None, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([5]))
        print(refused(lambda: KernelTokens(None, torch.tensor([[0, 1]]), torch.tensor([5]))))
        print(refused(lambda: KernelTokens(None, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).t(),
                                           torch.tensor([5, 5]))))
        print(refused(lambda: ok.attend(pool.double(), 0, torch.zeros(1, 2, 8))))
        print(refused(lambda: ok.attend(pool.transpose(4, 5), 0, torch.zeros(1, 2, 8))))
        print(refused(lambda: ok.attend(pool, 0, torch.zeros(1, 2, 8, dtype=torch.float64))))
    """)
    assert out.split() == ["TypeError", "ValueError", "TypeError", "ValueError", "TypeError"]


def test_the_schedulers_restore_bookkeeping_holds_under_python_O():
    # requeue and restore_joined once popped `restoring` inside an assert: under -O the pop was gone and
    # the sequence stayed restoring (and in the wait queue) at once
    out = run_optimized("""
        from compute_node.block_manager import BlockManager
        from compute_node.scheduler import Scheduler
        from compute_node.sequence import Sequence
        sched = Scheduler(BlockManager(16, 4), 4, 16)
        a = Sequence(list(range(9)), 2, block_tokens=4)
        sched.start_restore(a, 8)
        sched.requeue(a)
        print(a.seq_id in sched.restoring, list(sched.waiting) == [a])
        b = Sequence(list(range(20, 29)), 2, block_tokens=4)
        sched.start_restore(b, 8)
        sched.restore_joined(b, 8)
        print(b.seq_id in sched.restoring, list(sched.ready) == [b])
        try:
            sched.restore_joined(b, 8)  # not restoring any more: refused, nothing changes
        except RuntimeError as exc:
            print("refused", list(sched.ready) == [b])
    """)
    assert out.split() == ["False", "True", "False", "True", "refused", "True"]


def test_the_block_managers_and_sequences_checks_raise_under_python_O():
    out = run_optimized("""
        from compute_node.block_manager import BlockManager
        from compute_node.sequence import Sequence
        def refused(make):
            try:
                make()
            except (TypeError, ValueError, IndexError, RuntimeError) as exc:
                return type(exc).__name__
            return "accepted"
        bm = BlockManager(4, 4)
        print(refused(lambda: bm.unpin(0)))  # a pin count below zero would free a block under I/O
        a = Sequence(list(range(5)), 2, block_tokens=4)
        bm.allocate(a)
        print(refused(lambda: bm.allocate(a)))  # twice: the first blocks would leak
        print(refused(lambda: bm.mark_computed(a, 6)))
        print(refused(lambda: Sequence([], 1, 4)))
        print(refused(lambda: Sequence([1], 1, 4, salt="text")))
    """)
    assert out.split() == ["RuntimeError", "ValueError", "ValueError", "ValueError", "TypeError"]
