"""Queue pairs: depth, command id conflicts, waiting order, out-of-order completion, sq head."""
import pytest

from fabric import status as st
from storage_node.queues import ParkBudget, QueuePair
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


def test_past_depth_a_bounded_number_is_parked_and_the_next_refused_leaving_the_queue_as_it_was():
    qp = QueuePair(qid=2, depth=2, park=1)
    assert qp.submit(1, "a") and qp.submit(2, "b")
    assert not qp.submit(3, "c")  # parked
    with pytest.raises(NvmeError) as err:
        qp.submit(4, "d")
    assert err.value.status == st.COMMAND_INTERRUPTED and "queue 2 is full" in err.value.message
    assert qp.outstanding == 3 and qp.refused == 1
    assert [(cid, parked) for cid, _, parked in qp.items()] == [(1, False), (2, False), (3, True)]
    assert qp.complete(1) == ["c"]
    assert not qp.submit(4, "d")  # room again once one completed


class Payload:
    def __init__(self, nbytes: int):
        self.payload_bytes = nbytes


def test_parked_payloads_are_bounded_across_every_queue():
    budget = ParkBudget(limit=100)
    one, two = QueuePair(1, depth=1, budget=budget), QueuePair(2, depth=1, budget=budget)
    assert one.submit(1, Payload(500)) and two.submit(1, Payload(500))  # executing: not parked
    assert not one.submit(2, Payload(60))
    with pytest.raises(NvmeError) as err:
        two.submit(2, Payload(60))  # 120 bytes parked would pass the node's 100
    assert err.value.status == st.COMMAND_INTERRUPTED and "parked payloads" in err.value.message
    assert not two.submit(3, Payload(40)) and budget.used == 100
    one.complete(1)
    two.complete(1)
    assert budget.used == 0


def test_park_and_budget_guards_raise():
    with pytest.raises(ValueError):
        QueuePair(1, depth=1, park=-1)
    with pytest.raises(ValueError):
        ParkBudget(-1)
