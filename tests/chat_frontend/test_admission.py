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


def test_a_user_alone_takes_every_place_and_fills_the_waiting_room():
    """Work-conserving: with nobody else there, no quota and no share refuses a user."""
    async def scenario():
        adm = Admission(max_active=8, max_waiting=32, timeout_s=5)
        tasks, outcomes, release = greedy_and_modest(adm, 40)
        await settle()
        assert (adm.active, adm.waiting) == (8, 32) and not outcomes
        with pytest.raises(ChatError) as err:  # only a full room refuses it, and says so
            async with adm.turn("greedy", "one-more"):
                pass
        assert err.value.code == "RESOURCE_EXHAUSTED" and "busy: 8 turns running and 32 waiting" in err.value.message
        release.set()
        await asyncio.gather(*tasks)
        assert list(outcomes.values()) == ["ok"] * 40 and adm.stats.rejected_full == 1
        assert adm.active == adm.waiting == adm.users == 0
    asyncio.run(scenario())


def ordered(adm: Admission):
    """(one(user, ctx): a turn that holds its place until released, the contexts in the order they
    started, the release event of each)."""
    releases: dict[str, asyncio.Event] = {}
    order: list[str] = []

    async def one(user: str, ctx: str):
        releases[ctx] = asyncio.Event()
        async with adm.turn(user, ctx):
            order.append(ctx)
            await releases[ctx].wait()
    return one, order, releases


def test_a_newcomers_first_turn_starts_at_the_next_free_place():
    async def scenario():
        adm = Admission(max_active=4, max_waiting=16, timeout_s=5)
        one, order, releases = ordered(adm)
        tasks = [asyncio.create_task(one("greedy", f"g{i}")) for i in range(12)]
        await settle()
        assert order == ["g0", "g1", "g2", "g3"] and adm.waiting == 8
        tasks.append(asyncio.create_task(one("modest", "m0")))
        await settle()
        releases["g0"].set()
        await settle()
        assert order[-1] == "m0"  # before the greedy user's 8 older waiting turns
        releases["g1"].set()
        await settle()
        assert order[-1] == "g4"
        for ctx in list(releases):
            releases[ctx].set()
        while len(order) < 13:
            for ctx in order:
                releases[ctx].set()
            await settle()
        await asyncio.gather(*tasks)
    asyncio.run(scenario())


def test_places_go_to_the_user_with_fewest_running_then_round_robin():
    async def scenario():
        adm = Admission(max_active=1, max_waiting=32, timeout_s=5)
        one, order, releases = ordered(adm)
        tasks = [asyncio.create_task(one("greedy", f"g{i}")) for i in range(6)]
        await settle()
        tasks.append(asyncio.create_task(one("modest", "m0")))
        tasks.append(asyncio.create_task(one("other", "o0")))
        await settle()
        assert order == ["g0"] and adm.waiting == 7
        for _ in range(7):
            releases[order[-1]].set()
            await settle()
        # with one place, nobody holds one when it frees: the waiting users take turns, round-robin
        assert order == ["g0", "g1", "m0", "o0", "g2", "g3", "g4", "g5"]
        releases[order[-1]].set()
        await asyncio.gather(*tasks)
        assert len(order) == 8
    asyncio.run(scenario())


def test_a_full_waiting_room_pushes_out_its_largest_holders_newest_turn_never_a_newcomers():
    async def scenario():
        adm = Admission(max_active=1, max_waiting=6, timeout_s=5)
        tasks, outcomes, release = greedy_and_modest(adm, 7)
        await settle()
        assert (adm.active, adm.waiting) == (1, 6) and not outcomes
        release2, log = asyncio.Event(), []
        modest = asyncio.create_task(hold(adm, "m", release2, log, user="modest"))
        await settle()
        assert adm.waiting == 6 and outcomes == {"g6": "RESOURCE_EXHAUSTED"}  # the greedy user's newest
        assert adm.stats.rejected_pushed == 1 and adm.stats.rejected_full == 0
        second = asyncio.create_task(hold(adm, "m2", release2, log, user="modest"))
        await settle()
        assert outcomes.get("g5") == "RESOURCE_EXHAUSTED"  # greedy 4 waiting, modest 1: 4 >= 1 + 2
        third = asyncio.create_task(hold(adm, "m3", release2, log, user="modest"))
        await settle()
        assert outcomes.get("g4") == "RESOURCE_EXHAUSTED"  # greedy 4, modest 2: 4 >= 2 + 2
        with pytest.raises(ChatError):  # greedy 3, modest 3: a fourth modest turn is refused itself
            async with adm.turn("modest", "m4"):
                pass
        assert adm.stats.rejected_full == 1 and adm.stats.rejected_pushed == 3
        release.set()
        release2.set()
        await asyncio.gather(*tasks, modest, second, third)
        assert sorted(log) == [("in", "m"), ("in", "m2"), ("in", "m3"), ("out", "m"), ("out", "m2"), ("out", "m3")]
        assert list(outcomes.values()).count("ok") == 4
        assert adm.active == adm.waiting == adm.users == 0 and not adm._rotation
    asyncio.run(scenario())


def test_an_operators_quota_still_refuses():
    async def scenario():
        share = UserLimits(max_concurrent_turns=4, max_waiting_turns=8, max_queued_prompt_tokens=1 << 20)
        adm = Admission(max_active=64, max_waiting=32, timeout_s=5, limits_of=lambda user: share)
        tasks, outcomes, release = greedy_and_modest(adm, 130)
        await settle()
        # 4 run, 8 wait (its quota), the other 118 refused at once, though places are free
        assert (adm.active, adm.waiting) == (4, 8)
        assert list(outcomes.values()).count("RESOURCE_EXHAUSTED") == 118
        assert adm.stats.rejected_quota == 118 and adm.stats.rejected_full == 0
        log: list = []
        modest = asyncio.create_task(hold(adm, "m1", asyncio.Event(), log, user="modest"))
        await settle()
        assert log == [("in", "m1")]
        modest.cancel()
        release.set()
        await asyncio.gather(*tasks, modest, return_exceptions=True)
        assert list(outcomes.values()).count("ok") == 12
        assert adm.active == adm.waiting == adm.users == 0
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
        limits = {"gold": UserLimits(2, 0), "basic": UserLimits(1, 0)}
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
