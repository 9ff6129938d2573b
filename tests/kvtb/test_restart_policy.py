"""kvtb.restart_policy: compose's `restart: on-failure` with a doubling delay, a cap and a window."""
import pytest

from kvtb.restart_policy import Limits, RestartPolicy


def test_the_delay_doubles_up_to_its_cap():
    policy = RestartPolicy(Limits(first_delay_s=1, max_delay_s=5, max_restarts=10, window_s=1000))
    delays = [policy.died(float(t), None) for t in range(6)]
    assert delays == [1, 2, 4, 5, 5, 5]


def test_a_replica_that_stayed_up_starts_again_from_the_first_delay():
    policy = RestartPolicy(Limits(first_delay_s=1, reset_after_s=10, window_s=1000))
    assert [policy.died(0.0, None), policy.died(2.0, None)] == [1, 2]
    assert policy.died(20.0, up_since=15.0) == 4   # up 5 s: not long enough
    assert policy.died(40.0, up_since=25.0) == 1   # up 15 s: reset
    assert policy.died(41.0, None) == 2


def test_too_many_restarts_within_the_window_give_up_for_good():
    policy = RestartPolicy(Limits(max_restarts=3, window_s=60, reset_after_s=1000))
    assert all(policy.died(t, None) is not None for t in (0.0, 10.0, 20.0))
    assert policy.died(30.0, None) is None and policy.gave_up
    assert policy.died(500.0, None) is None  # given up stays given up
    assert "3 restarts within 60 s (at most 3)" in policy.describe()


def test_restarts_older_than_the_window_no_longer_count():
    policy = RestartPolicy(Limits(max_restarts=2, window_s=60, max_delay_s=30))
    assert policy.died(0.0, None) is not None and policy.died(10.0, None) is not None
    assert policy.died(61.0, None) is not None  # the one at 0 left the window
    assert policy.died(65.0, None) is None      # 10 and 61 are within it


def test_no_restart_at_all():
    assert RestartPolicy(Limits(max_restarts=0)).died(0.0, None) is None


@pytest.mark.parametrize("bad", [dict(first_delay_s=-1), dict(first_delay_s=40, max_delay_s=30),
                                 dict(max_restarts=-1), dict(max_restarts=1.5), dict(max_restarts=True),
                                 dict(window_s=0), dict(reset_after_s=-1)])
def test_limits_are_checked(bad):
    with pytest.raises(ValueError):
        Limits(**bad)
