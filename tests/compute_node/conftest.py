"""Fixtures for the compute node's tests: a tiny random Llama, the real tokenizer, nodes in-process."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from compute_node.settings import ComputeSettings
from kvtb_proto import compute_pb2, compute_pb2_grpc
from tests.conftest import secure_channel

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
    base = dict(pool_tokens=512, block_tokens=8, max_context_tokens=256, layer_groups=2, max_num_seqs=8,
                max_num_batched_tokens=64, listen_address="127.0.0.1:0",
                agent_address="", storage_fabric_addresses=(), policy="resident",
                node_name=f"test{os.getpid()}", metrics_address="127.0.0.1:0")
    base.update(overrides)
    return ComputeSettings(**base)


@pytest.fixture
def make_node(tiny_model, tokenizer):
    """Start an in-process node (tiny model) on port 0, with a FakeNic standing in for the agent's
    data plane when nic=True (the `triggered` policy then works); stopped after the test."""
    from compute_node.node import serve
    from compute_node.offload import TriggeredOffload
    from tests.compute_node.fake_nic import FakeNic
    made = []

    def make(nic: bool = False, model=None, **overrides):
        overrides.setdefault("node_name", f"test{os.getpid()}-{len(made)}")  # one region each
        node = serve(tiny_settings(**overrides), model or tiny_model, tokenizer)
        node.start()
        node.nic = None
        if nic:  # wired in before any turn
            node.nic = FakeNic(node.pool)
            node.engine.offloaders["triggered"] = TriggeredOffload(node.pool, node.settings.drain_timeout_s)
        made.append(node)
        node.address = node.addresses["grpc"]
        node.stub = compute_pb2_grpc.ComputeNodeStub(secure_channel(node.address, peer="compute"))
        return node

    yield make
    for node in made:
        if node.nic is not None:
            node.nic.close()
        node.stop()


def run_turn(node, ids, context="c", policy="resident", n=16, user="u", tenant="default", **kw):
    """One turn through the node's gRPC service, as the agent sends it (step 5's lookup in the
    FakeNic, its restore events answered); (tokens, record, restore events)."""
    stored = node.nic.lookup(ids, tenant, user, kw.get("shared_prefix_tokens", 0)) \
        if node.nic is not None and policy == "triggered" else 0
    request = compute_pb2.TurnRequest(request_id=f"r-{context}", user_id=user, context_id=context,
                                      token_ids=ids, max_new_tokens=n, policy=policy, tenant=tenant,
                                      stored_tokens=stored, **{"ignore_eos": True, **kw})
    tokens, record, restores = [], None, []
    for event in node.stub.Generate(request, timeout=120):
        if event.HasField("restore"):
            restores.append(event.restore)
            node.nic.restore(event.restore)
        elif event.HasField("token"):
            tokens.append(event.token.id)
        else:
            record = event.record
    return tokens, record, restores


# -- real processes: a storage node, the agent and a compute node with the real model

SALT = "compute-test-salt"


@dataclasses.dataclass
class Cluster:
    storage: object
    agent: object
    compute: object
    data_dir: object

    @property
    def agent_address(self) -> str:
        return self.agent.addresses["grpc"]

    @property
    def compute_address(self) -> str:
        return self.compute.addresses["grpc"]


def start_cluster(tmp_dir, name: str, **compute_env) -> Cluster:
    """storage -> agent -> compute node, each a real `kvtb serve` process, ready when this returns."""
    from kvtb.launch import ServiceProcess, kvtb_argv
    started = []

    def start(service: str, env: dict) -> ServiceProcess:
        proc = ServiceProcess(f"{name}-{service}", kvtb_argv("serve", service), tmp_dir / f"{name}-{service}.log",
                              env=env)
        started.append(proc)
        proc.start(timeout_s=240)
        return proc

    try:
        storage = start("storage", {
            "KVTB_STORAGE_NODE_NAME": "s0", "KVTB_STORAGE_DATA_DIR": str(tmp_dir / f"{name}-s0"),
            "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0", "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0",
            "KVTB_STORAGE_SUBSYSTEM_NQN": "nqn.2026-11.org.kvtestbed:s0",
            "KVTB_STORAGE_NAMESPACE_SIZE_BYTES": str(512 << 20)})
        agent = start("smartnic", {
            "KVTB_SMARTNIC_LISTEN_ADDRESS": "127.0.0.1:0", "KVTB_SMARTNIC_SALT": SALT,
            "KVTB_SMARTNIC_STORAGE_NODES": f"s0={storage.addresses['admin']}={storage.addresses['fabric']}",
            "KVTB_SMARTNIC_GET_TIMEOUT_S": "1.0", "KVTB_SMARTNIC_FABRIC_TIMEOUT_S": "2.0",
            "KVTB_SMARTNIC_RECONNECT_INTERVAL_S": "0.3"})
        env = {"KVTB_COMPUTE_LISTEN_ADDRESS": "127.0.0.1:0", "KVTB_COMPUTE_AGENT_ADDRESS": agent.addresses["grpc"],
               "KVTB_COMPUTE_STORAGE_FABRIC_ADDRESSES": storage.addresses["fabric"], "KVTB_COMPUTE_KEY_SALT": SALT,
               "KVTB_COMPUTE_POOL_TOKENS": "4096", "KVTB_COMPUTE_MAX_CONTEXT_TOKENS": "1024",
               "KVTB_COMPUTE_NODE_NAME": f"{name}{os.getpid()}", "KVTB_COMPUTE_RESTORE_TIMEOUT_S": "8"}
        env.update(compute_env)
        compute = start("compute", env)
    except BaseException:
        for proc in reversed(started):
            proc.stop()
        raise
    return Cluster(storage, agent, compute, tmp_dir)


def stop_cluster(cluster: Cluster) -> None:
    for proc in (cluster.compute, cluster.agent, cluster.storage):
        proc.stop()


class Chat:
    """A client of the compute node through the agent (the frontend's path)."""

    def __init__(self, address: str, user: str = "alice"):
        from kvtb_proto import compute_pb2_grpc
        self.channel = secure_channel(address)
        self.stub = compute_pb2_grpc.ComputeNodeStub(self.channel)
        self.user = user

    def encode(self, text: str, previous=None) -> list[int]:
        from kvtb_proto import compute_pb2
        message = compute_pb2.ChatMessage(role="user", content=text)
        request = compute_pb2.EncodeChatRequest(
            messages=[message], add_generation_prompt=True, continuation=previous is not None,
            close_previous_turn=previous is not None and previous.finish_reason == "length")
        return list(self.stub.EncodeChat(request, timeout=30).token_ids)

    def turn(self, ids: list[int], context: str, policy: str = "", n: int = 24):
        """(reply text, record)."""
        from kvtb_proto import compute_pb2
        text, record = [], None
        request = compute_pb2.TurnRequest(request_id=f"{context}-{len(ids)}", user_id=self.user, context_id=context,
                                          token_ids=ids, max_new_tokens=n, policy=policy)
        for event in self.stub.Generate(request, timeout=300):
            if event.HasField("token"):
                text.append(event.token.text)
            else:
                record = event.record
        return "".join(text), record

    def conversation(self, messages: list[str], context: str, policy: str = "", n: int = 24):
        """Run the messages as turns of one conversation; return [(text, record)]."""
        ids, previous, out = [], None, []
        for message in messages:
            ids = ids + (list(previous.output_token_ids) if previous else []) + self.encode(message, previous)
            text, previous = self.turn(ids, context, policy, n)
            out.append((text, previous))
        return out

    def close(self) -> None:
        self.channel.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), "main")
    yield cluster
    stop_cluster(cluster)
