"""Fixtures for the compute node's tests: a tiny random Llama, the real tokenizer, nodes in-process."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from compute_node.settings import ComputeSettings

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tokenizer():
    from compute_node.model_loader import load_tokenizer
    return load_tokenizer(ComputeSettings().model_cache_dir)


@pytest.fixture(scope="session")
def tiny_model():
    """A randomly initialised 2-layer Llama with the real vocabulary (fast)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=2048, eos_token_id=2, bos_token_id=1, pad_token_id=2)
    return LlamaForCausalLM(config).eval()


def tiny_settings(**overrides) -> ComputeSettings:
    base = dict(num_slots=4, max_context_tokens=256, chunk_tokens=8, listen_address="127.0.0.1:0",
                agent_address="", storage_fabric_addresses=(), policy="resident",
                node_name=f"test{os.getpid()}")
    base.update(overrides)
    return ComputeSettings(**base)


class FakeAgent:
    """Stands in for the agent's triggered-op engine: fires PUTs when the token counter allows."""

    region_id = 7
    access_key = "k"

    def __init__(self):
        self.pool = None
        self.queued: list = []   # every op queued, in order
        self.pending: list = []
        self.cancels = 0

    def queue(self, ops):
        self.queued.extend(ops)
        self.pending.extend(ops)
        self._fire()
        return list(range(len(ops)))

    def _fire(self):
        for op in list(self.pending):
            if self.pool.counter_total(op.trigger_counter) >= op.threshold:
                self.pending.remove(op)
                self.pool.region.add_counter(op.completion_counter, success=1)

    def cancel(self, counter):
        self._fire()
        mine = [op for op in self.pending if op.trigger_counter == counter]
        for op in mine:
            self.pending.remove(op)
        self.cancels += 1
        return len(mine)


@dataclasses.dataclass
class Node:
    engine: object
    address: str
    close: object


@pytest.fixture
def make_node(tiny_model, tokenizer):
    """Start an in-process node (tiny model) on port 0; stopped after the test."""
    from compute_node.main import build_node
    nodes = []

    def make(agent=None, **overrides) -> Node:
        settings = tiny_settings(**overrides)
        server, engine, address, health, close = build_node(settings, tiny_model, tokenizer)
        if agent is not None:
            agent.pool = engine.pool
            from compute_node.offload import TriggeredOffload
            engine.agent = agent
            engine._offloaders["triggered"] = TriggeredOffload(engine.pool, agent)
        server.start()
        health.set_serving()
        node = Node(engine, address, close)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.close()
