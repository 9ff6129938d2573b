"""The paper's analytical model: time to move a KV cache from GPU memory to remote NVMe.

Two paths (Dhakal et al., Sections III and V; parameters from Tables II and III):

- CPU-centric: cudaMemcpy GPU -> host over PCIe, then the host network stack (one DRAM copy and
  the CPU's processing), then the NIC's DMA from host memory onto the wire, the network, and the
  remote NVMe write. The CPU synchronises between these steps, so they add up (store and forward),
  and one chunk finishes before the next one starts.
- Triggered: the NIC reads the GPU buffer peer-to-peer over PCIe and streams it through its memory
  and ALU onto the wire (cut-through, so the slowest part sets the per-byte cost), then the network
  and the remote NVMe write. The triggered operations for every chunk are queued in advance, so
  chunks pipeline across the three stages (NIC, network, NVMe queue).

Every equation, and the reading of every ambiguous unit, is written down in docs/analytical-model.md.
Pure: no I/O; sizes in bytes, times in seconds.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

PAPER_SPEEDUP_MIN = 19.0  # "consistently larger than 19X in larger data sizes" (Sec. V-B, Fig. 7)
PAPER_SPEEDUP_MAX = 23.0  # "23X improvement at small data sizes" (Sec. V-B, Fig. 7)

Stages = dict[str, float]  # stage name -> seconds, in path order


@dataclass(frozen=True)
class ModelParams:
    """Tables II and III, plus the readings the paper leaves open. Frozen; safe to share."""

    # Table II: inverse bandwidths, seconds per byte.
    beta_pcie_s_per_byte: float = 8.12e-12
    beta_vram_s_per_byte: float = 4.55e-13
    beta_cpu_s_per_byte: float = 4.55e-13
    beta_dram_s_per_byte: float = 1.21e-12
    beta_nic_serial_s_per_byte: float = 5.13e-11
    beta_nic_mem_s_per_byte: float = 1.43e-11
    beta_nic_alu_s_per_byte: float = 5.22e-12
    # Table II NVMe models: beta = 1 / (base + slope * m), i.e. bandwidth = base + slope * m bytes/s.
    nvme_write_bw_base_bytes_per_s: float = 2.34e9
    nvme_write_bw_slope_per_s: float = 6.83
    nvme_read_bw_base_bytes_per_s: float = 5.22e9
    nvme_read_bw_slope_per_s: float = 19.4
    # Table III: latencies. The NVMe models are `a + b * m` in `nvme_latency_unit_s`.
    lambda_pcie_s: float = 3.2e-8
    lambda_network_s: float = 1.21e-12
    nvme_write_latency_base: float = 3.3
    nvme_write_latency_per_byte: float = 4.10e-7
    nvme_read_latency_base: float = 2.03
    nvme_read_latency_per_byte: float = 2.63e-7
    nvme_latency_unit_s: float = 1e-3  # our reading: milliseconds (see the doc)
    # Section IV/V: 512 MB chunks; Section IV: a 100 Gbps link (None: the NIC serialisation rate).
    chunk_bytes: int = 512 * MIB
    link_s_per_byte: float | None = None
    include_nvme: bool = True
    triggered_pipelines_chunks: bool = True
    cpu_pipelines_chunks: bool = False

    def __post_init__(self):
        if not (self.chunk_bytes > 0):
            raise ValueError("chunk_bytes must be positive")
        if not (self.nvme_latency_unit_s > 0):
            raise ValueError("nvme_latency_unit_s must be positive")


def wire_s_per_byte(p: ModelParams) -> float:
    """Per-byte cost of putting bytes on the wire: NIC serialisation, or a slower link if given."""
    return max(p.beta_nic_serial_s_per_byte, p.link_s_per_byte or 0.0)


def nvme_write_s(m: float, p: ModelParams) -> float:
    """NVMe write of m bytes: latency model (Table III) plus m times the bandwidth model (Table II)."""
    if not p.include_nvme:
        return 0.0
    latency_s = (p.nvme_write_latency_base + p.nvme_write_latency_per_byte * m) * p.nvme_latency_unit_s
    return latency_s + m / (p.nvme_write_bw_base_bytes_per_s + p.nvme_write_bw_slope_per_s * m)


def nvme_read_s(m: float, p: ModelParams) -> float:
    """NVMe read of m bytes: latency model (Table III) plus m times the bandwidth model (Table II)."""
    if not p.include_nvme:
        return 0.0
    latency_s = (p.nvme_read_latency_base + p.nvme_read_latency_per_byte * m) * p.nvme_latency_unit_s
    return latency_s + m / (p.nvme_read_bw_base_bytes_per_s + p.nvme_read_bw_slope_per_s * m)


def cpu_chunk_stages(m: float, p: ModelParams) -> Stages:
    """Stage times of one m-byte chunk on the CPU-centric path (they add: store and forward)."""
    return {
        # cudaMemcpy D2H: a DMA streams VRAM -> PCIe -> DRAM, so its slowest part sets the rate.
        "gpu_to_host": p.lambda_pcie_s
        + m * max(p.beta_vram_s_per_byte, p.beta_pcie_s_per_byte, p.beta_dram_s_per_byte),
        # Network stack: the CPU copies into socket buffers (one DRAM pass) and processes them.
        "host_stack": m * (p.beta_dram_s_per_byte + p.beta_cpu_s_per_byte),
        # NIC DMA from host memory over PCIe, serialised onto the wire.
        "host_to_wire": p.lambda_pcie_s
        + m * max(p.beta_dram_s_per_byte, p.beta_pcie_s_per_byte, wire_s_per_byte(p)),
        "network": p.lambda_network_s,
        "nvme_write": nvme_write_s(m, p),
    }


def triggered_chunk_stages(m: float, p: ModelParams) -> Stages:
    """Stage times of one m-byte chunk on the triggered path (GPU -> NIC peer-to-peer, cut-through)."""
    return {
        "gpu_to_wire": p.lambda_pcie_s
        + m * max(
            p.beta_vram_s_per_byte,
            p.beta_pcie_s_per_byte,
            p.beta_nic_mem_s_per_byte,
            p.beta_nic_alu_s_per_byte,
            wire_s_per_byte(p),
        ),
        "network": p.lambda_network_s,
        "nvme_write": nvme_write_s(m, p),
    }


def split_chunks(total_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Return [(chunk size, count), ...]: full chunks first, then the remainder (one chunk if small)."""
    if not (total_bytes > 0):
        raise ValueError("total_bytes must be positive")
    full, rest = divmod(total_bytes, chunk_bytes)
    parts = [(chunk_bytes, full)] if full else []
    return parts + [(rest, 1)] if rest else parts


def path_time_s(total_bytes: int, stages_of: Callable[[float, ModelParams], Stages],
                pipelined: bool, p: ModelParams) -> float:
    """Time to move total_bytes in chunks: serial sum, or a pipeline over the stages."""
    parts = split_chunks(total_bytes, p.chunk_bytes)
    if not pipelined:
        return sum(count * sum(stages_of(size, p).values()) for size, count in parts)
    # Pipeline of identical stages: the first chunk fills every stage, each later chunk adds the
    # bottleneck stage's time: T = sum_k s_k(c_1) + sum_{i>=2} max_k s_k(c_i).
    first_size = parts[0][0]
    total_s = sum(stages_of(first_size, p).values())
    for i, (size, count) in enumerate(parts):
        later = count - 1 if i == 0 else count
        total_s += later * max(stages_of(size, p).values())
    return total_s


def cpu_centric_s(total_bytes: int, p: ModelParams = ModelParams()) -> float:
    """Time to move total_bytes from GPU memory to remote NVMe, CPU-centric."""
    return path_time_s(total_bytes, cpu_chunk_stages, p.cpu_pipelines_chunks, p)


def triggered_s(total_bytes: int, p: ModelParams = ModelParams()) -> float:
    """Time to move total_bytes from GPU memory to remote NVMe with triggered operations."""
    return path_time_s(total_bytes, triggered_chunk_stages, p.triggered_pipelines_chunks, p)


def default_sizes() -> list[int]:
    """The sweep of Figs. 5-7: 32 KiB, 64 KiB, ... 4 TiB (powers of two), then 5 TiB."""
    return [2**e for e in range(15, 43)] + [5 * TIB]


def sweep(sizes: list[int], p: ModelParams = ModelParams()) -> list[dict]:
    """One row per size: bytes, cpu_s, triggered_s, speedup."""
    rows = []
    for size in sizes:
        cpu, trig = cpu_centric_s(size, p), triggered_s(size, p)
        rows.append({"bytes": size, "cpu_s": cpu, "triggered_s": trig, "speedup": cpu / trig})
    return rows


def alternative_readings() -> dict[str, ModelParams]:
    """The model under each reading of the paper's ambiguous units and choices; "chosen" is ours."""
    base = ModelParams()
    alt = dataclasses.replace
    return {
        "chosen": base,
        "nvme_latency_in_s": alt(base, nvme_latency_unit_s=1.0),
        "nvme_latency_in_us": alt(base, nvme_latency_unit_s=1e-6),
        "nvme_bw_m_in_mb": alt(base, nvme_write_bw_slope_per_s=6.83 / MIB),
        "network_latency_1.21us": alt(base, lambda_network_s=1.21e-6),
        "link_100gbps": alt(base, link_s_per_byte=8 / 100e9),
        "cpu_chunks_pipelined": alt(base, cpu_pipelines_chunks=True),
        "triggered_chunks_serial": alt(base, triggered_pipelines_chunks=False),
        "without_nvme": alt(base, include_nvme=False),
    }


def speedup_range(p: ModelParams, sizes: list[int] | None = None) -> tuple[float, float]:
    """Return (min, max) speedup of triggered over CPU-centric across sizes."""
    speedups = [row["speedup"] for row in sweep(sizes or default_sizes(), p)]
    return min(speedups), max(speedups)


def cpu_overhead_needed_s(target_speedup: float, total_bytes: int, p: ModelParams = ModelParams()) -> float:
    """Extra CPU-centric seconds (not in Tables II/III) needed for the target speedup at total_bytes."""
    return target_speedup * triggered_s(total_bytes, p) - cpu_centric_s(total_bytes, p)
