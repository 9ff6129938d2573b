"""torch's threads: as many as the compute node's CPUs, each bound to one of them (a real process)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from compute_node.torch_threads import bind_openmp, thread_count
from kvtb import placement
from tests.conftest import secure_channel


def test_thread_count_is_one_per_cpu_unless_set():
    assert thread_count(0, (0, 1, 2)) == 3
    assert thread_count(0, (5,)) == 1
    assert thread_count(2, (0, 1, 2, 3)) == 2
    with pytest.raises(ValueError, match="torch_threads"):
        thread_count(-1, (0,))


def test_bind_openmp_gives_each_thread_a_place_of_its_own():
    env: dict[str, str] = {}
    assert bind_openmp((3, 1), 2, env) == env
    assert env == {"OMP_NUM_THREADS": "2", "OMP_PLACES": "{1},{3}", "OMP_PROC_BIND": "close"}


def test_bind_openmp_leaves_a_users_binding_alone():
    env = {"GOMP_CPU_AFFINITY": "0-3"}
    bind_openmp((0, 1), 2, env)
    assert env == {"GOMP_CPU_AFFINITY": "0-3", "OMP_NUM_THREADS": "2"}


def test_bind_openmp_refuses_once_torch_is_imported():
    import torch  # noqa: F401 - the compute node's tests import it anyway
    with pytest.raises(RuntimeError, match="imported already"):
        bind_openmp((0,), 1)


def _threads(pid: int) -> dict[int, tuple[int, ...]]:
    """thread id -> the CPUs it may run on (/proc/PID/task/*/status)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        line = next(l for l in status.splitlines() if l.startswith("Cpus_allowed_list:"))
        out[int(tid)] = placement.parse_cpus(line.split(":", 1)[1])
    return out


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny_model, tokenizer):
    """The tiny random Llama and the real tokenizer saved where a compute node process loads them."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def _compute_env(model_dir: Path, cpus: str) -> dict[str, str]:
    return {"KVTB_COMPUTE_CPUS": cpus, "KVTB_COMPUTE_MODEL_CACHE_DIR": str(model_dir),
            "KVTB_COMPUTE_POLICY": "resident", "KVTB_COMPUTE_AGENT_ADDRESS": "",
            "KVTB_COMPUTE_STORAGE_FABRIC_ADDRESSES": "", "KVTB_COMPUTE_LISTEN_ADDRESS": "127.0.0.1:0",
            "KVTB_COMPUTE_POOL_TOKENS": "512", "KVTB_COMPUTE_BLOCK_TOKENS": "8",
            "KVTB_COMPUTE_MAX_CONTEXT_TOKENS": "256", "KVTB_COMPUTE_NODE_NAME": f"threads{os.getpid()}",
            "KVTB_COMPUTE_TORCH_THREADS": "0"}  # the default (one per CPU), whatever the test run set


def _one_turn(address: str) -> None:
    """A short turn, so that torch's OpenMP team has started."""
    from kvtb_proto import compute_pb2, compute_pb2_grpc
    stub = compute_pb2_grpc.ComputeNodeStub(secure_channel(address, peer="compute"))
    request = compute_pb2.TurnRequest(request_id="r", user_id="u", context_id="c", token_ids=[1, 2, 3, 4],
                                      max_new_tokens=4, policy="resident", ignore_eos=True)
    events = list(stub.Generate(request, timeout=120))
    assert any(e.HasField("token") for e in events)


def test_compute_node_on_cpu_0_runs_every_thread_there(start_service, tiny_model_dir):
    proc = start_service("compute", "serve", "compute", env=_compute_env(tiny_model_dir, "0"))
    assert proc.ready["cpus"] == "0"
    assert proc.ready["torch_threads"] == 1
    _one_turn(proc.addresses["grpc"])
    threads = _threads(proc.proc.pid)
    assert len(threads) > 3  # gRPC's, the engine's, torch's: not just the main thread
    assert {tid: cpus for tid, cpus in threads.items() if cpus != (0,)} == {}
    assert "runs on CPUs 0" in proc.log_tail(200)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_compute_node_on_two_cpus_binds_one_torch_thread_to_each(start_service, tiny_model_dir):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    text = placement.format_cpus(cpus)
    proc = start_service("compute", "serve", "compute", env=_compute_env(tiny_model_dir, text))
    assert proc.ready["cpus"] == text and proc.ready["torch_threads"] == 2
    _one_turn(proc.addresses["grpc"])
    deadline = time.monotonic() + 10
    while True:
        threads = _threads(proc.proc.pid)
        bound = sorted(c for c in threads.values() if len(c) == 1)
        if bound or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert all(set(c) <= set(cpus) for c in threads.values())
    # the engine's thread (the team's master) and its worker: one on each CPU
    assert {c[0] for c in bound} == set(cpus)
    # the rest (gRPC, the main thread) may use the whole set
    assert any(c == tuple(cpus) for c in threads.values())
