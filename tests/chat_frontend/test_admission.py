import asyncio

import pytest

from chat_frontend.admission import Admission, UserLimits, estimate_tokens
from chat_frontend.errors import ChatError


async def hold(adm: Admission, ctx: str, release: asyncio.Event, log: list, user: str = "u",
               tokens: int = 0):
    async with adm.turn(user, ctx, tokens):
        log.append(("in", ctx))
        await release.wait()
        log.append(("out", ctx))


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_bounded_wait_then_refusal():
    async def scenario():
        adm = Admission(max_active=1, max_waiting=1, timeout_s=5)
        release, log = asyncio.Event(), []
        first = asyncio.create_task(hold(adm, "a", release, log))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(hold(adm, "b", release, log))
        await asyncio.sleep(0.01)
        assert (adm.active, adm.waiting) == (1, 1)
        with pytest.raises(ChatError) as err:
            async with adm.turn("v", "c"):
                pass
        assert err.value.code == "RESOURCE_EXHAUSTED" and "1 turns running and 1 waiting" in err.value.message
        assert err.value.retry_after_s >= 1
        release.set()
        await asyncio.gather(first, second)
        assert log == [("in", "a"), ("out", "a"), ("in", "b"), ("out", "b")]
        assert adm.stats.admitted == 2 and adm.stats.rejected_full == 1
        assert adm.users == 0 and not adm._busy and not adm._rotation
    asyncio.run(scenario())


def test_wait_times_out_with_resource_exhausted():
    async def scenario():
        adm = Admission(max_active=1, max_waiting=4, timeout_s=0.05)
        release = asyncio.Event()
        first = asyncio.create_task(hold(adm, "a", release, []))
        await asyncio.sleep(0.01)
        with pytest.raises(ChatError) as err:
            async with adm.turn("v", "b"):
                pass
        assert err.value.code == "RESOURCE_EXHAUSTED" and "waited 0.05 s" in err.value.message
        release.set()
        await first
        assert adm.waiting == 0 and adm.active == 0 and adm.users == 0
    asyncio.run(scenario())


def test_turns_of_one_context_run_one_after_the_other():
    async def scenario():
        adm = Admission(max_active=4, max_waiting=4, timeout_s=5)
        release, log = asyncio.Event(), []
        tasks = [asyncio.create_task(hold(adm, "same", release, log)) for _ in range(3)]
        tasks.append(asyncio.create_task(hold(adm, "other", release, log)))
        await asyncio.sleep(0.01)
        assert log == [("in", "same"), ("in", "other")]
        release.set()
        await asyncio.gather(*tasks)
        ins = [i for i, e in enumerate(log) if e == ("in", "same")]
        outs = [i for i, e in enumerate(log) if e == ("out", "same")]
        assert all(o < i for o, i in zip(outs, ins[1:]))
        assert adm.users == 0 and not adm._busy
    asyncio.run(scenario())


def greedy_and_modest(adm: Admission, greedy_turns: int):
    """The greedy user's turns, as tasks; (tasks, outcomes by context: 'ok' or the refusal)."""
    outcomes: dict[str, str] = {}
    release = asyncio.Event()

    async def one(ctx: str):
        try:
            async with adm.turn("greedy", ctx):
                await release.wait()
            outcomes[ctx] = "ok"
        except ChatError as exc:
            outcomes[ctx] = exc.code
    return [asyncio.create_task(one(f"g{i}")) for i in range(greedy_turns)], outcomes, release


def test_greedy_user_with_130_turns_leaves_room_for_a_modest_user():
    """The failure of issue 31: one user's 130 streams held every place and the waiting room."""
    async def scenario():
        share = UserLimits(max_concurrent_turns=4, max_waiting_turns=8, max_queued_prompt_tokens=1 << 20)
        adm = Admission(max_active=8, max_waiting=32, timeout_s=5, limits_of=lambda user: share)
        tasks, outcomes, release = greedy_and_modest(adm, 130)
        await settle()
        # 4 run, 8 wait (its share), the other 118 refused at once
        assert (adm.active, adm.waiting) == (4, 8)
        assert list(outcomes.values()).count("RESOURCE_EXHAUSTED") == 118
        assert adm.stats.rejected_share == 118 and adm.stats.rejected_full == 0
        log: list = []
        modest = asyncio.create_task(hold(adm, "m1", asyncio.Event(), log, user="modest"))
        await settle()
        assert log == [("in", "m1")]  # at once: a free place, though the greedy user has 8 waiting
        modest.cancel()
        release.set()
        await asyncio.gather(*tasks, modest, return_exceptions=True)
        assert list(outcomes.values()).count("ok") == 12
        assert adm.active == adm.waiting == adm.users == 0
    asyncio.run(scenario())


def test_places_go_round_robin_across_users_not_first_come():
    async def scenario():
        adm = Admission(max_active=1, max_waiting=32, timeout_s=5)
        releases = {}
        order: list[str] = []

        async def one(user: str, ctx: str):
            releases[ctx] = asyncio.Event()
            async with adm.turn(user, ctx):
                order.append(ctx)
                await releases[ctx].wait()
        tasks = [asyncio.create_task(one("greedy", f"g{i}")) for i in range(6)]
        await settle()
        tasks.append(asyncio.create_task(one("modest", "m0")))
        tasks.append(asyncio.create_task(one("other", "o0")))
        await settle()
        assert order == ["g0"] and adm.waiting == 7
        for _ in range(7):
            releases[order[-1]].set()
            await settle()
        # after g0 (running when they came): the waiting users take turns, not the greedy user's queue first
        assert order == ["g0", "g1", "m0", "o0", "g2", "g3", "g4", "g5"]
        releases[order[-1]].set()
        await asyncio.gather(*tasks)
        assert len(order) == 8
    asyncio.run(scenario())


def test_one_user_never_takes_more_than_half_the_waiting_room():
    async def scenario():
        share = UserLimits(max_concurrent_turns=1, max_waiting_turns=100, max_queued_prompt_tokens=1 << 20)
        adm = Admission(max_active=1, max_waiting=6, timeout_s=5, limits_of=lambda user: share)
        tasks, outcomes, release = greedy_and_modest(adm, 10)
        await settle()
        assert (adm.active, adm.waiting) == (1, 3)
        release2, log = asyncio.Event(), []
        modest = asyncio.create_task(hold(adm, "m", release2, log, user="modest"))
        await settle()
        assert adm.waiting == 4 and list(outcomes.values()) == ["RESOURCE_EXHAUSTED"] * 6
        release.set()
        release2.set()
        await asyncio.gather(*tasks, modest)
        assert log == [("in", "m"), ("out", "m")]
    asyncio.run(scenario())


def test_queued_prompt_tokens_are_capped_per_user_but_one_turn_always_passes():
    async def scenario():
        share = UserLimits(max_concurrent_turns=8, max_waiting_turns=8, max_queued_prompt_tokens=10_000)
        adm = Admission(max_active=8, max_waiting=8, timeout_s=5, limits_of=lambda user: share)
        release, log = asyncio.Event(), []
        big = asyncio.create_task(hold(adm, "big", release, log, user="greedy", tokens=7_000))
        await settle()
        with pytest.raises(ChatError) as err:
            async with adm.turn("greedy", "big2", 7_000):
                pass
        assert err.value.code == "RESOURCE_EXHAUSTED" and "limit of 10000" in err.value.message
        huge = asyncio.create_task(hold(adm, "huge", release, log, user="modest", tokens=50_000))
        small = asyncio.create_task(hold(adm, "small", release, log, user="greedy", tokens=2_000))
        await settle()
        assert sorted(log) == [("in", "big"), ("in", "huge"), ("in", "small")]
        release.set()
        await asyncio.gather(big, huge, small)
        assert adm.users == 0
    asyncio.run(scenario())


def test_per_user_limits_come_from_the_callback():
    async def scenario():
        limits = {"gold": UserLimits(2, 0, 1 << 20), "basic": UserLimits(1, 0, 1 << 20)}
        adm = Admission(max_active=8, max_waiting=8, timeout_s=5, limits_of=limits.__getitem__)
        release, log = asyncio.Event(), []
        tasks = [asyncio.create_task(hold(adm, f"{u}{i}", release, log, user=u))
                 for u in ("gold", "basic") for i in range(3)]
        await settle()
        assert sorted(e[1] for e in log) == ["basic0", "gold0", "gold1"]
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [isinstance(r, ChatError) for r in results] == [False, False, True, False, True, True]
    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_no_trace():
    async def scenario():
        adm = Admission(max_active=1, max_waiting=4, timeout_s=5)
        release = asyncio.Event()
        first = asyncio.create_task(hold(adm, "a", release, [], user="x"))
        await settle()
        waiter = asyncio.create_task(hold(adm, "b", release, [], user="y", tokens=5))
        await settle()
        assert adm.waiting == 1 and adm.users == 2
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert adm.waiting == 0 and adm.users == 1 and not adm._rotation
        release.set()
        await first
        assert adm.users == 0
    asyncio.run(scenario())


def test_estimate_tokens_counts_bytes():
    assert estimate_tokens("") == 4
    assert estimate_tokens("a" * 400, "b" * 4) == (100 + 4) + (1 + 4)
    assert estimate_tokens("\ud800") >= 1  # a lone surrogate is counted, not an error
