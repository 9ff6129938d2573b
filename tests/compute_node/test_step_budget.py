"""The step budget: a step's time learned from the steps seen, the chunk that fits a target, the hold (pure)."""
from __future__ import annotations

import random

import pytest

from compute_node.step_budget import MIN_STEPS, StepBudget, features, kpairs


def cost(runs, a=0.01, b=0.001, c=0.0002):
    """A machine whose step takes a + b * tokens + c * kpairs seconds."""
    x = features(runs)
    return a + b * x[1] + c * x[2]


def trained(budget: StepBudget, machine=cost, steps=12, seed=0) -> StepBudget:
    """The budget after the engine fed it `steps` steps of varied sizes and depths."""
    rng = random.Random(seed)
    for _ in range(steps):
        runs = [(rng.randrange(0, 4000), rng.randrange(1, 512))] + [(rng.randrange(0, 300), 1)] * rng.randrange(0, 6)
        budget.observe(runs, machine(runs))
    return budget


def test_kpairs_counts_each_new_tokens_keys():
    assert kpairs(0, 1) == 0.001 and kpairs(0, 3) == 0.006  # keys 1 + 2 + 3
    assert kpairs(1000, 2) == (1001 + 1002) / 1000
    assert list(features([(0, 3), (10, 1)])) == [1.0, 4.0, (6 + 11) / 1000]
    with pytest.raises(ValueError):
        kpairs(-1, 2)


def test_nothing_is_capped_before_the_estimate_is_made():
    budget = StepBudget(0.1)
    for _ in range(MIN_STEPS - 1):
        budget.observe([(0, 512)], 5.0)
    assert budget.predict([(0, 1)]) is None and budget.fit([], 0, 512) == 512


def test_the_fit_recovers_the_machine_and_gives_the_largest_chunk_within_the_target():
    budget = trained(StepBudget(0.1))
    for runs in ([(0, 512)], [(6000, 16), (40, 1)], [(3000, 100)]):
        assert budget.predict(runs) == pytest.approx(cost(runs), rel=1e-5)
    decodes = [(200, 1), (300, 1)]
    for start in (0, 2000, 6000):
        n = budget.fit(decodes, start, 512)
        assert 0 < n < 512
        assert cost(decodes + [(start, n)]) <= 0.1 + 1e-6 < cost(decodes + [(start, n + 1)]) + 2e-6
    assert budget.fit(decodes, 6000, 512) < budget.fit(decodes, 0, 512)  # deeper: fewer tokens fit
    assert budget.fit(decodes, 0, 10) == 10  # the limit when all of it fits
    assert budget.fit([(0, 200)], 0, 512) == 0  # the step is over the target already


def test_the_estimate_follows_a_slower_machine():
    budget = trained(StepBudget(0.1))
    before = budget.fit([], 1000, 512)

    def slower(runs):
        return 3 * cost(runs)
    trained(budget, slower, steps=40, seed=1)
    after = budget.fit([], 1000, 512)
    assert after < before / 2
    assert slower([(1000, after)]) <= 0.1 * 1.05


def test_coefficients_stay_non_negative_on_noisy_steps():
    budget = StepBudget(0.1)
    rng = random.Random(3)
    for _ in range(50):
        runs = [(rng.randrange(0, 100), rng.randrange(1, 64))]
        budget.observe(runs, 0.05 + rng.uniform(-0.02, 0.02))  # no dependence on size at all, only noise
    assert budget.coef is not None and (budget.coef >= 0).all()
    assert budget.fit([], 0, 512) >= 1


def test_the_target_is_full_beside_a_running_user_half_while_a_turn_is_about_to_start_and_for_hold_s():
    budget = StepBudget(0.2, hold_s=1.0)
    assert budget.step_target(False, False) is None  # alone: no cap
    assert budget.step_target(True, True) == 0.2  # another user's sequence runs: its tokens wait for the step
    assert budget.step_target(True, False) == 0.1  # another user's turn waits or restores
    budget.observe([(0, 10)], 0.6)
    assert budget.step_target(False, False) == 0.1  # within hold_s of stepped time: its next turn may come
    budget.observe([(10, 10)], 0.6)
    assert budget.step_target(False, False) is None  # 1.2 s of steps since


@pytest.mark.parametrize("kwargs", [dict(target_s=0), dict(target_s=-1), dict(target_s=0.1, decay=1.0),
                                    dict(target_s=0.1, hold_s=-1), dict(target_s=0.1, min_steps=0)])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        StepBudget(**kwargs)


def test_a_negative_step_time_is_refused():
    with pytest.raises(ValueError):
        StepBudget(0.1).observe([(0, 1)], -0.5)


def test_the_setting_defaults_to_a_quarter_second_reads_from_the_environment_and_refuses_a_negative():
    from compute_node.settings import ComputeSettings
    from kvtb.settings import SettingsError, load_settings
    assert ComputeSettings().step_target_s == 0.25
    got = load_settings(ComputeSettings, "compute", environ={"KVTB_COMPUTE_STEP_TARGET_S": "0.5"})
    assert got.step_target_s == 0.5
    assert load_settings(ComputeSettings, "compute", environ={"KVTB_COMPUTE_STEP_TARGET_S": "0"}).step_target_s == 0
    for bad in (-0.1, float("nan"), True):
        with pytest.raises(SettingsError):
            ComputeSettings(step_target_s=bad)


def test_a_step_cap_without_a_budget_or_contention_leaves_chunks_full():
    from compute_node.step_budget import StepCap
    assert StepCap(None, 3, 3).tokens([(0, 1, True)], 100, 512) == 512
    budget = StepBudget(0.25)
    assert not StepCap(budget, 1, 1).on  # alone
    assert StepCap(budget, 1, 1).tokens([], 0, 512) == 512


def test_a_step_cap_gives_a_prefill_beside_decodes_at_least_one_token():
    from compute_node.step_budget import StepCap
    budget = StepBudget(0.25)
    for n in (10, 20, 30, 10, 20):  # 10 ms a token
        budget.observe([(0, n)], 0.01 * n)
    cap = StepCap(budget, 2, 2)  # another user runs: the whole target
    assert cap.on and cap.target == pytest.approx(0.25)
    decodes = [(0, 1, True)] * 25  # 0.25 s of decodes: not one more token fits
    assert cap.tokens(decodes, 0, 64) == 1                # only decodes scheduled: one token, to move on
    assert cap.tokens(decodes + [(0, 8, False)], 0, 64) == 0  # another prefill already moves this step
    assert cap.tokens(decodes, 0, 64, [(0, 8)]) == 0      # a reserved admission comes first
    assert 10 <= cap.tokens([(0, 1, True)] * 10, 0, 64) <= 16  # 0.1 s of decodes: about 15 tokens fit
