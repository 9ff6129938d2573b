"""The frontend's /metrics families: the replicas' (in the rotation, turns served, turns retried), and
the histograms a chat turn observes per request (each of its choices)."""
import asyncio

from chat_frontend.chat_service import ChatService
from chat_frontend.metrics import Tenants, families
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb import metrics
from kvtb_proto import frontend_pb2

from .fakes import FakeEngine

FIGURES = {"turns_active": 1, "turns_waiting": 0, "rejected_busy": 0, "contexts": 2}


def samples(replicas=None) -> dict:
    out = {}
    for family in families(Tenants(), lambda: FIGURES, replicas):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_each_replica_up_and_its_turns_and_the_retries():
    got = samples(lambda: {"up": {"replica-0": 1, "replica-1": 0}, "turns": {"replica-0": 5, "replica-1": 2},
                           "retries": 1})
    assert got[("kvtb:replica_up", (("replica", "replica-0"),))] == 1
    assert got[("kvtb:replica_up", (("replica", "replica-1"),))] == 0
    assert got[("kvtb:replica_turns_total", (("replica", "replica-0"),))] == 5
    assert got[("kvtb:replica_turns_total", (("replica", "replica-1"),))] == 2
    assert got[("kvtb:replica_retries_total", ())] == 1


def test_without_replicas_no_replica_families():
    assert not any(name.startswith("kvtb:replica") for name, _ in samples())


class QueuedEngine(FakeEngine):
    """FakeEngine whose records say each choice waited 400 ms in the compute node's queue."""

    async def generate(self, request, route=None):
        async for event in super().generate(request, route):
            if event.HasField("record"):
                event.record.queue_ms = 400.0
            yield event


def observed(name: str) -> tuple[float, float]:
    """(count, sum) of the frontend's kvtb: histogram NAME for the tenant "default"."""
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in metrics.histogram(name).collect()
           for s in family.samples}
    labels = (("tenant", "default"),)
    return got.get((f"kvtb:{name}_count", labels), 0.0), got.get((f"kvtb:{name}_sum", labels), 0.0)


def test_a_chat_turns_choices_each_observed_as_a_request(tmp_path):
    """n=2: two requests, each its whole prompt, its generated tokens and its wait (admission plus the
    compute node's queue time); every token after a choice's first is a time per output token."""
    settings = FrontendSettings(data_dir=str(tmp_path), users={"alice": "ta"})
    engine = QueuedEngine(reply_words=3)
    service = ChatService(settings, SessionStore(settings.db_path), engine)
    names = ("request_prompt_tokens", "request_generation_tokens", "request_queue_time_seconds",
             "time_per_output_token_seconds")
    before = {name: observed(name) for name in names}

    async def turn():
        request = frontend_pb2.ChatRequest(token="ta", message="a cheesecake recipe", max_new_tokens=8, n=2)
        return [e async for e in service.chat(request)]
    asyncio.run(turn())
    added = {name: tuple(a - b for a, b in zip(observed(name), before[name])) for name in names}
    prompt = len(engine.turns[0].token_ids)
    assert added["request_prompt_tokens"] == (2, 2 * prompt)
    assert added["request_generation_tokens"] == (2, 8)  # 3 words and the stop token each
    count, total = added["request_queue_time_seconds"]
    assert count == 2 and 0.8 <= total < 1.8
    assert added["time_per_output_token_seconds"][0] == 6  # 4 tokens per choice, 3 gaps each
