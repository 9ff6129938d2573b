import asyncio

import pytest

from chat_frontend.admission import Admission
from chat_frontend.errors import ChatError


async def hold(adm: Admission, ctx: str, release: asyncio.Event, log: list):
    async with adm.turn(ctx):
        log.append(("in", ctx))
        await release.wait()
        log.append(("out", ctx))


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
            async with adm.turn("c"):
                pass
        assert err.value.code == "RESOURCE_EXHAUSTED" and "1 turns running and 1 waiting" in err.value.message
        release.set()
        await asyncio.gather(first, second)
        assert log == [("in", "a"), ("out", "a"), ("in", "b"), ("out", "b")]
        assert adm.stats.admitted == 2 and adm.stats.rejected_full == 1
        assert adm._context_locks == {}
    asyncio.run(scenario())


def test_wait_times_out_with_resource_exhausted():
    async def scenario():
        adm = Admission(max_active=1, max_waiting=4, timeout_s=0.05)
        release = asyncio.Event()
        first = asyncio.create_task(hold(adm, "a", release, []))
        await asyncio.sleep(0.01)
        with pytest.raises(ChatError) as err:
            async with adm.turn("b"):
                pass
        assert err.value.code == "RESOURCE_EXHAUSTED" and "waited 0.05 s" in err.value.message
        release.set()
        await first
        assert adm.waiting == 0 and adm.active == 0 and adm._context_locks == {}
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
        assert adm._context_locks == {}
    asyncio.run(scenario())
