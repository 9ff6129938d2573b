"""The engine under a hardware profile: its steps and swap copies are paced, its replies unchanged."""
from __future__ import annotations

import pytest

from scale import dilation as dl
from scale import settings as scale_settings
from tests.compute_node.test_engine import PROMPTS, alone, together


@pytest.fixture
def paced():
    """polaris-a100 at D = 2 in this process (the in-process node's), back to real time after."""
    _, pacer = scale_settings.install_from(scale_settings.ScaleSettings("polaris-a100", 2.0))
    yield pacer
    scale_settings.install_from(scale_settings.ScaleSettings())
    assert dl.current() is None


def test_a_profiled_run_gives_the_replies_of_an_unprofiled_one_and_paces_every_step(make_node, paced):
    dl.install(None)  # the reference: real time
    scale_settings._install_profile(None)
    solo = alone(make_node, PROMPTS[:3])
    scale_settings.install_from(scale_settings.ScaleSettings("polaris-a100", 2.0))
    pacer = dl.current()
    node = make_node()
    results = together(node, PROMPTS[:3])
    assert [tokens for tokens, _, _ in results] == solo  # time changes, tokens never
    steps = pacer.snapshot()["kinds"]["gpu_step"]
    assert steps["ops"] >= 12  # at least one per generated token of the longest reply
    assert steps["modeled_s"] > 0 and steps["real_s"] > 0


@pytest.mark.parametrize("preemption", ["swap-host"])
def test_swap_copies_are_paced_and_replies_stay_right(make_node, paced, preemption):
    prompts = [list(range(300 + 11 * i, 300 + 11 * i + 40)) for i in range(4)]
    dl.install(None)
    scale_settings._install_profile(None)
    solo = alone(make_node, prompts, pool_tokens=512)
    scale_settings.install_from(scale_settings.ScaleSettings("polaris-a100", 2.0))
    pacer = dl.current()
    node = make_node(pool_tokens=16 * 8, preemption=preemption, swap_space_tokens=4096)
    results = together(node, prompts, n=12)
    assert [tokens for tokens, _, _ in results] == solo
    kinds = pacer.snapshot()["kinds"]
    assert kinds.get("swap_out", {}).get("ops", 0) > 0, kinds
    assert kinds.get("swap_in", {}).get("ops", 0) > 0, kinds
