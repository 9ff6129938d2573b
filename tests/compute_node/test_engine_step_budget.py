"""The engine's step budget with the tiny model and an injected slow step: the measured step time shrinks a
long prompt's chunks while another user's turn runs beside it; alone they stay full."""
from __future__ import annotations

import concurrent.futures
import time

from tests.compute_node.test_engine_fairness import first_token_at

PER_TOKEN_S = 0.004  # the injected slowness: a 64-token step takes ~0.26 s, past the 0.1 s target
TARGET_S = 0.1
HOG, VICTIM = 1000, 5000  # where each user's token ids start (a run's first id says whose it is)


def slow_steps(node) -> list[list[tuple[int, int, int]]]:
    """Slow the node's forward by PER_TOKEN_S a token; record each step's (first id, start, tokens) per run."""
    real, steps = node.engine.runner.step, []

    def step(batch, before_layer=None):
        steps.append([(r.token_ids[0], r.start, len(r.token_ids)) for r in batch])
        time.sleep(PER_TOKEN_S * sum(len(r.token_ids) for r in batch))
        return real(batch, before_layer)
    node.engine.runner.step = step
    return steps


def hog_chunks(steps, base: int, prompt: int = 240) -> list[int]:
    """The prefill chunks of the long prompt whose ids start at `base`, in step order."""
    return [n for step in steps for first, start, n in step if base <= first < base + 1000 and start < prompt]


def beside(node, steps, hog_first: int, hog_len: int, victim_out: int, timeout_s: float = 120) -> None:
    """A long prompt of hog_len tokens (ids from hog_first) starts; once its first chunk is under way a short
    turn of another user (12 tokens, victim_out out) comes in beside it; both end."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        hog = pool.submit(first_token_at, node, list(range(hog_first, hog_first + hog_len)), "hog", f"h{hog_first}", 2)
        deadline = time.monotonic() + 30
        while not steps:  # the long prompt's first (full) chunk is under way
            assert time.monotonic() < deadline
            time.sleep(0.002)
        victim = pool.submit(first_token_at, node, list(range(VICTIM, VICTIM + 12)), "victim", "v", victim_out)
        assert victim.result(timeout=timeout_s)[1] == victim_out and hog.result(timeout=timeout_s)[1] == 2


def test_a_slow_step_shrinks_a_long_prompts_chunks_beside_another_users_turn_and_alone_they_stay_full(make_node):
    node = make_node(max_num_batched_tokens=64, step_target_s=TARGET_S, max_context_tokens=256)
    steps = slow_steps(node)
    _, out = first_token_at(node, list(range(HOG, HOG + 240)), "hog", "alone", 2)  # alone: 240 tokens in full chunks
    assert out == 2
    alone = hog_chunks(steps, HOG)
    assert alone == [64, 64, 64, 48], alone

    steps.clear()
    beside(node, steps, HOG + 300, 240, 8)
    near = hog_chunks(steps, HOG + 300)
    budget = node.engine.step_budget
    assert budget.coef is not None and budget.coef[1] > PER_TOKEN_S / 2  # it measured the slow tokens
    assert near[0] == 64 and min(near) < 64, near  # the chunks shrank once the victim's turn came in
    assert sum(near) == 240
    with_victim = [sum(n for _, _, n in step) for step in steps if any(VICTIM <= f < VICTIM + 1000 for f, _, _ in step)]
    assert max(with_victim) < 64, with_victim  # each step the victim waited on carried well under a full chunk


def test_without_a_step_target_the_chunks_stay_full_beside_another_user(make_node):
    node = make_node(max_num_batched_tokens=64, step_target_s=0, max_context_tokens=256)
    assert node.engine.step_budget is None
    steps = slow_steps(node)
    beside(node, steps, HOG, 240, 8)
    # the token budget alone: the victim's 12 and the hog's chunk share 64 tokens
    assert max(sum(n for _, _, n in step) for step in steps) == 64


def test_under_a_profile_the_budget_learns_virtual_seconds_and_keeps_the_chunks_full(make_node):
    """A paced step's wall time is D times the modeled GPU's: learnt as wall seconds, every step would look
    D times too slow and a batch's prefills would trickle in (the poster under polaris-a100, D 65: batches
    of 1.7 sequences where 16 fit)."""
    from scale import dilation as dl
    from scale import settings as scale_settings
    d = 20.0
    scale_settings.install_from(scale_settings.ScaleSettings("polaris-a100", d))
    try:
        node = make_node(max_num_batched_tokens=64, step_target_s=TARGET_S, max_context_tokens=256)
        seen, real_observe = [], node.engine.step_budget.observe
        node.engine.step_budget.observe = lambda runs, s: (seen.append(s), real_observe(runs, s))[1]
        steps = slow_steps(node)  # every 64-token step takes >= 0.256 s of wall time, past the target
        beside(node, steps, HOG, 192, 4, timeout_s=300)
        wall = dl.current().snapshot()["kinds"]["gpu_step"]["real_s"]
    finally:
        scale_settings.install_from(scale_settings.ScaleSettings())
    assert seen and max(seen) < PER_TOKEN_S * 64 / 4  # virtual: a fraction of the >= 0.256 s of wall time
    assert sum(seen) <= wall / d * 1.5 + 0.05
    # in virtual time a full step is well within the target (even its half, while a turn is about to start):
    # the budget never cuts the long prompt's chunks; learnt in wall seconds it would predict past the target
    budget = node.engine.step_budget
    assert budget.coef is not None and budget.predict([(0, 64)]) < TARGET_S * 0.5
    assert sum(hog_chunks(steps, HOG, 192)) == 192 and max(sum(n for *_, n in step) for step in steps) == 64
