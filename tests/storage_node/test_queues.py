"""Queue pairs: depth, command id conflicts, waiting order, out-of-order completion, sq head."""
import pytest

from fabric import status as st
from storage_node.queues import QueuePair
from fabric.status import NvmeError


def test_depth_limits_executing_commands_and_the_rest_wait_in_order():
    qp = QueuePair(qid=1, depth=2)
    assert qp.submit(10, "a") and qp.submit(11, "b")
    assert not qp.submit(12, "c") and not qp.submit(13, "d")
    assert qp.outstanding == 4 and qp.waiting == 2
    assert qp.complete(11) == ["c"]
    assert qp.complete(10) == ["d"]
    assert qp.complete(12) == [] and qp.complete(13) == []
    assert qp.outstanding == 0


def test_duplicate_command_id_conflicts_while_outstanding_only():
    qp = QueuePair(qid=1, depth=1)
    qp.submit(7)
    qp.submit(8)  # waits
    for cid in (7, 8):
        with pytest.raises(NvmeError) as err:
            qp.submit(cid)
        assert err.value.status == st.COMMAND_ID_CONFLICT
    qp.complete(7)
    qp.complete(8)
    assert qp.submit(7)


def test_completions_out_of_order_and_sq_head_counts_fetched_commands_modulo_depth():
    qp = QueuePair(qid=3, depth=4)
    for cid in range(4):
        qp.submit(cid)
    assert qp.sq_head == 0  # 4 fetched, modulo depth 4
    qp.complete(2)
    qp.complete(0)
    qp.submit(9)
    assert qp.sq_head == 1
    qp.complete(3)
    qp.complete(1)
    qp.complete(9)
    assert qp.outstanding == 0
