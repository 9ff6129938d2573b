"""/metrics in process over test_completions_api's TextEngine: who may read it, and vLLM's names."""
from prometheus_client.parser import text_string_to_metric_families

from .test_completions_api import AUTH, OPERATOR, TextEngine, run


def test_metrics_take_an_operators_token_and_show_vllm_names():
    engine = TextEngine(stop=False)

    async def scenario(client):
        await client.post("/v1/completions", headers=AUTH, json={"model": "fake", "prompt": "a", "n": 2,
                                                                  "max_tokens": 3})
        anonymous = await client.get("/metrics")
        user = await client.get("/metrics", headers=AUTH)
        ops = await client.get("/metrics", headers=OPERATOR)
        return anonymous.status, user.status, ops.status, await ops.text()
    anonymous, user, ops, text = run(engine, scenario)
    assert (anonymous, user, ops) == (401, 403, 200)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    labels = (("engine", "0"), ("model_name", "fake"))
    assert samples[("vllm:num_requests_waiting", labels)] == 3  # waiting + restoring
    assert samples[("vllm:kv_cache_usage_perc", labels)] == 0.25
    assert samples[("vllm:prompt_tokens_total", labels)] == 48
    assert samples[("vllm:prefix_cache_hits_total", labels)] == 8
    assert samples[("vllm:request_success_total", (labels[0], ("finished_reason", "length"), labels[1]))] == 2
    assert samples[("vllm:e2e_request_latency_seconds_count", labels)] >= 1
    assert not any("alice" in str(key) for key in samples)  # tenants, never users


def test_metrics_take_a_metrics_readers_token_and_count_each_choice_as_a_request():
    """A metrics reader (Prometheus's user) reads /metrics and nothing an operator may; each choice of a
    completions request is one observation of vLLM's request histograms."""
    engine = TextEngine(stop=False, reply_words=3)
    reader = {"Authorization": "Bearer t-prom"}

    def counts(text: str) -> dict:
        return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
                if s.name.startswith("vllm:request_") and s.name.endswith("_count")}

    async def scenario(client):
        before = await (await client.get("/metrics", headers=reader)).text()
        await client.post("/v1/completions", headers=AUTH, json={"model": "fake", "prompt": ["a b", "c"], "n": 2,
                                                                  "max_tokens": 3})
        after = await client.get("/metrics", headers=reader)
        return after.status, counts(before), counts(await after.text())
    status, before, after = run(engine, scenario, users={"alice": "t-alice", "prom": "t-prom"},
                                metrics_readers=("prom",), operators=())
    assert status == 200
    for name in ("vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count",
                 "vllm:request_queue_time_seconds_count"):
        assert after[name] - before.get(name, 0) == 4, name  # 2 prompts x n 2
    assert run(engine, lambda client: _status(client, "/metrics", AUTH), metrics_readers=()) == 403


async def _status(client, path, headers):
    return (await client.get(path, headers=headers)).status
