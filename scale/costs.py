"""Modeled times of hardware operations under a profile. Pure: sizes in bytes, times in seconds.

- `gpu_step_s`: a roofline step (Vidur's and LLMServingSim's kind of model): the larger of the step's
  FLOPs over peak x efficiency and its bytes over bandwidth x efficiency, plus a launch overhead.
  FLOPs: 2 per parameter per token, plus attention (QK^T and PV: 4 x layers x heads x head_dim per
  pair of query token and context token). Bytes: the weights once, plus every sequence's KV read
  and the new KV written.
- `copy_s`: a link's latency plus bytes over its bandwidth.
- `nvme_s`: Table II/III's form, latency a + b m plus m over the bandwidth base + slope m.
- The paper's two paths, block by block, as the stages `bench/analytical_model.py` adds or pipelines.
"""
from __future__ import annotations

from collections.abc import Sequence

from scale.profile import Link, NvmeOp, Profile, ProfileError

# One sequence's share of a step: (context tokens already in the KV cache, new tokens this step).
SeqWork = tuple[int, int]


def step_flops(p: Profile, batch: Sequence[SeqWork]) -> float:
    m = _model(p)
    tokens = sum(n for _, n in batch)
    # query token i of a chunk starting at context c attends to c + i + 1 tokens (causal)
    pairs = sum(n * c + n * (n + 1) / 2 for c, n in batch)
    return 2.0 * m.params * tokens + 4.0 * m.layers * m.heads * m.head_dim * pairs


def step_bytes(p: Profile, batch: Sequence[SeqWork]) -> float:
    m = _model(p)
    kv = m.kv_bytes_per_token
    return m.weights_bytes + sum((c + n) * kv + n * kv for c, n in batch)  # read the KV, write the new


def gpu_step_s(p: Profile, batch: Sequence[SeqWork]) -> float:
    """One forward over the batch: max(compute, memory) + launch overhead."""
    gpu = p.gpu
    if gpu is None:
        raise ProfileError(f"profile {p.name} has no gpu")
    if not batch:
        return 0.0
    compute = step_flops(p, batch) / (gpu.peak_flops * gpu.flops_efficiency)
    memory = step_bytes(p, batch) / (gpu.mem_bytes_per_s * gpu.mem_efficiency)
    return max(compute, memory) + gpu.launch_s


def copy_s(link: Link, nbytes: float) -> float:
    return link.latency_s + nbytes / link.bytes_per_s


def nvme_s(op: NvmeOp, nbytes: float) -> float:
    return op.latency_s + op.latency_s_per_byte * nbytes + nbytes / (op.bytes_per_s + op.bytes_per_s_per_byte * nbytes)


def nvme_write_s(p: Profile, nbytes: float) -> float:
    return nvme_s(p.nvme.write, nbytes)


def nvme_read_s(p: Profile, nbytes: float) -> float:
    return nvme_s(p.nvme.read, nbytes)


def link_s(p: Profile, name: str, nbytes: float) -> float:
    return copy_s(p.link(name), nbytes)


# -- the paper's two paths, one block of m bytes: stage -> seconds, in path order --------------------

def cpu_centric_stages(p: Profile, m: float) -> dict[str, float]:
    """Store and forward: the host copies the block out, runs its stack, the NIC DMAs it from host
    memory onto the wire, the fabric, the NVMe write. The host thread waits for each store's
    acknowledgement, which follows the write, wherever a triggered transfer is read to end."""
    return {"gpu_to_host": link_s(p, "gpu_to_host", m), "host_stack": link_s(p, "host_stack", m),
            "host_to_wire": link_s(p, "host_to_wire", m), "fabric": link_s(p, "fabric", m),
            "nvme_write": nvme_write_s(p, m)}


def triggered_stages(p: Profile, m: float) -> dict[str, float]:
    """Cut-through: the trigger, the NIC's peer-to-peer DMA onto the wire, the fabric, the NVMe write."""
    stages = {"nic_dma": p.trigger_latency_s + link_s(p, "nic_dma", m), "fabric": link_s(p, "fabric", m)}
    if p.transfer_ends == "nvme_write":
        stages["nvme_write"] = nvme_write_s(p, m)
    return stages


def path_s(stages_per_block: Sequence[dict[str, float]], pipelined: bool) -> float:
    """Serial: every stage of every block adds. Pipelined (each stage one server, blocks in order):
    the finish time of the last block through the stages."""
    if not pipelined:
        return sum(sum(s.values()) for s in stages_per_block)
    free: list[float] = []
    end = 0.0
    for stages in stages_per_block:
        t = 0.0
        for k, cost in enumerate(stages.values()):
            if k == len(free):
                free.append(0.0)
            t = max(t, free[k]) + cost
            free[k] = t
        end = t
    return end


def _model(p: Profile):
    if p.model is None:
        raise ProfileError(f"profile {p.name} names no virtual model")
    return p.model
