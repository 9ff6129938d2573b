"""The definitions of the engine's time in preemption work (compute_node.preemption_cost)."""
from __future__ import annotations

import pytest

from compute_node.preemption_cost import PreemptionCost, recompute_share, recomputed_tokens, restore_wait


def test_only_tokens_below_the_mark_are_recomputed():
    assert recomputed_tokens(0, 40, 0) == 0          # never preempted
    assert recomputed_tokens(0, 40, 30) == 30        # a prefill again: 30 were lost, 10 are new
    assert recomputed_tokens(16, 16, 30) == 14       # a chunk past the prefix cache's 16 tokens
    assert recomputed_tokens(30, 1, 30) == 0         # the decode after the recompute: new work
    assert recomputed_tokens(40, 8, 30) == 0
    with pytest.raises(ValueError):
        recomputed_tokens(-1, 4, 0)


def test_a_steps_forward_time_is_apportioned_by_tokens():
    # a recompute prefill of 30 lost + 2 new tokens beside 8 decodes: 30 of the step's 40 tokens
    runs = [(0, 32, 30)] + [(100, 1, 0)] * 8
    seconds, tokens = recompute_share(2.0, runs)
    assert tokens == 30 and seconds == pytest.approx(2.0 * 30 / 40)
    assert recompute_share(1.0, []) == (0.0, 0)
    assert recompute_share(1.0, [(5, 1, 0)]) == (0.0, 0)
    with pytest.raises(ValueError):
        recompute_share(-1.0, runs)


def test_a_restore_wait_runs_from_its_start_to_ready_and_is_never_negative():
    assert restore_wait(10.0, 10.25) == pytest.approx(0.25)
    assert restore_wait(10.0, 9.0) == 0.0


def test_the_totals_add_up():
    cost = PreemptionCost()
    cost.add_step(1.0, [(0, 10, 10), (3, 1, 0)])
    cost.add_step(0.5, [(3, 1, 0)])
    cost.swap_out_s, cost.swap_in_s, cost.swap_wait_s = 0.1, 0.2, 0.7
    assert cost.recompute_tokens == 10 and cost.recompute_s == pytest.approx(10 / 11)
    assert cost.swap_s == pytest.approx(1.0) and cost.engine_s == pytest.approx(10 / 11 + 0.3)
    d = cost.as_dict()
    assert d["preempt_swap_s"] == pytest.approx(1.0) and d["preempt_recompute_tokens"] == 10
