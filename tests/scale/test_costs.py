"""scale.costs: modeled times of hardware operations, checked against numbers worked out by hand.

The expected values are computed in the comments from the profiles' figures, not by calling the
code under test. Where a profile value enters, the test first checks that it is still the value
the hand computation used.
"""
from __future__ import annotations

import pytest

from bench import analytical_model as am
from scale import costs
from scale import profile as pf

KIB, MIB = 1024, 1024 * 1024


@pytest.fixture(scope="module")
def polaris() -> pf.Profile:
    p = pf.load("polaris-a100")
    # The figures the hand computations below use.
    m, g = p.model, p.gpu
    assert (m.params, m.layers, m.heads, m.kv_heads, m.head_dim, m.weight_bytes, m.kv_bytes) == (
        6.74e9, 32, 32, 32, 128, 2, 2)
    assert (g.peak_flops, g.flops_efficiency, g.mem_bytes_per_s, g.mem_efficiency, g.launch_s) == (
        312e12, 0.6, 1.555e12, 0.8, 3.0e-4)
    return p


@pytest.fixture(scope="module")
def paper() -> pf.Profile:
    return pf.load("paper")


# -- the roofline step -------------------------------------------------------------------------------
#
# Llama-2-7B geometry under polaris-a100:
#   KV per token = 2 (K, V) x 32 layers x 32 kv heads x 128 x 2 bytes = 524,288 B (512 KiB)
#   attention FLOPs per (query, context) pair = 4 x 32 layers x 32 heads x 128 = 524,288
#   weights = 6.74e9 x 2 B = 13.48e9 B
#   compute rate = 312e12 x 0.6 = 187.2e12 FLOP/s; memory rate = 1.555e12 x 0.8 = 1.244e12 B/s

def test_a_decode_step_is_memory_bound(polaris):
    batch = [(1024, 1)]  # one sequence, 1,024 tokens cached, one new token
    # FLOPs: 2 x 6.74e9 x 1 token = 13.48e9, plus attention over 1 x 1024 + 1 x 2 / 2 = 1,025 pairs
    #   x 524,288 = 537,395,200  ->  14,017,395,200
    assert costs.step_flops(polaris, batch) == pytest.approx(14_017_395_200, rel=1e-12)
    # bytes: 13.48e9 weights + (1024 + 1) x 524,288 KV read (537,395,200) + 1 x 524,288 KV written
    #   -> 14,017,919,488
    assert costs.step_bytes(polaris, batch) == pytest.approx(14_017_919_488, rel=1e-12)
    # compute side: 14,017,395,200 / 187.2e12 = 7.4879e-5 s
    # memory side:  14,017,919,488 / 1.244e12 = 1.12684240e-2 s   <- binds (150x the compute side)
    # step = 1.12684240e-2 + 3.0e-4 launch = 1.15684240e-2 s
    assert costs.gpu_step_s(polaris, batch) == pytest.approx(0.011568424025723473, rel=1e-9)


def test_a_prefill_step_is_compute_bound(polaris):
    batch = [(0, 512)]  # a 512-token chunk, nothing cached
    # FLOPs: 2 x 6.74e9 x 512 = 6.90176e12, plus attention over 512 x 513 / 2 = 131,328 pairs
    #   x 524,288 = 68,853,694,464  ->  6,970,613,694,464
    assert costs.step_flops(polaris, batch) == pytest.approx(6_970_613_694_464, rel=1e-12)
    # bytes: 13.48e9 + 512 x 524,288 read + 512 x 524,288 written = 14,016,870,912
    assert costs.step_bytes(polaris, batch) == pytest.approx(14_016_870_912, rel=1e-12)
    # compute side: 6,970,613,694,464 / 187.2e12 = 3.72361843e-2 s   <- binds
    # memory side:  14,016,870,912 / 1.244e12  = 1.12675811e-2 s
    # step = 3.72361843e-2 + 3.0e-4 = 3.75361843e-2 s
    assert costs.gpu_step_s(polaris, batch) == pytest.approx(0.037536184265299144, rel=1e-9)


def test_batching_decodes_shares_the_weights(polaris):
    # Two sequences at 1,024 each: the weights are read once, the KV of both:
    # bytes = 13.48e9 + 2 x 1,026 x 524,288 = 13.48e9 + 1,075,838,976 = 14,555,838,976
    # step = 14,555,838,976 / 1.244e12 + 3e-4 = 1.17008352e-2 + 3e-4 = 1.20008352e-2 s
    # (one sequence's 1.15684e-2 s: the second costs 3.7% more, not 100%)
    assert costs.gpu_step_s(polaris, [(1024, 1)] * 2) == pytest.approx(0.012000835189710611, rel=1e-9)


def test_an_empty_step_costs_nothing_and_a_profile_without_gpu_is_refused(polaris, paper):
    assert costs.gpu_step_s(polaris, []) == 0.0
    with pytest.raises(pf.ProfileError, match="has no gpu"):
        costs.gpu_step_s(paper, [(0, 1)])
    with pytest.raises(pf.ProfileError, match="names no virtual model"):
        costs.step_bytes(paper, [(0, 1)])


# -- links -----------------------------------------------------------------------------------------------

def test_a_pcie_copy_of_64_mib(polaris):
    # gpu_to_host: 1.0e-5 s + 67,108,864 B / 2.5e10 B/s = 1.0e-5 + 2.68435456e-3 = 2.69435456e-3 s
    assert costs.link_s(polaris, "gpu_to_host", 64 * MIB) == pytest.approx(2.69435456e-3, rel=1e-12)
    assert costs.copy_s(polaris.link("host_to_gpu"), 64 * MIB) == pytest.approx(2.69435456e-3, rel=1e-12)


def test_a_link_the_profile_lacks_is_named(paper):
    with pytest.raises(pf.ProfileError, match="host_to_gpu"):
        costs.link_s(paper, "host_to_gpu", 1)


# -- Table III's NVMe rows (the paper profile) ------------------------------------------------------------
#
# write: T(m) = (3.3 + 4.10e-7 m) ms + m / (2.34e9 + 6.83 m)
# read:  T(m) = (2.03 + 2.63e-7 m) ms + m / (5.22e9 + 19.4 m)

def test_nvme_write_and_read_at_32_kib(paper):
    m = 32 * KIB  # 32,768 B
    # write latency 3.3e-3 + 4.10e-10 x 32,768 = 3.3e-3 + 1.343488e-5 = 3.31343488e-3 s
    #   bandwidth 2.34e9 + 6.83 x 32,768 = 2,340,223,805.44 B/s -> 32,768 / that = 1.40020796e-5 s
    #   total 3.32743696e-3 s
    assert costs.nvme_write_s(paper, m) == pytest.approx(3.327436959597613e-3, rel=1e-9)
    # read latency 2.03e-3 + 2.63e-10 x 32,768 = 2.03e-3 + 8.617984e-6 = 2.038617984e-3 s
    #   bandwidth 5.22e9 + 19.4 x 32,768 = 5,220,635,699.2 B/s -> 6.27663026e-6 s
    #   total 2.04489461e-3 s
    assert costs.nvme_read_s(paper, m) == pytest.approx(2.044894614258844e-3, rel=1e-9)


def test_nvme_write_and_read_at_512_mib(paper):
    m = 512 * MIB  # 536,870,912 B
    # write latency 3.3e-3 + 4.10e-10 x 536,870,912 = 3.3e-3 + 0.22011707392 = 0.22341707392 s
    #   bandwidth 2.34e9 + 6.83 x 536,870,912 = 6,006,828,328.96 B/s -> 0.0893767697 s
    #   total 0.3127938436 s
    assert costs.nvme_write_s(paper, m) == pytest.approx(0.31279384358921936, rel=1e-9)
    # read latency 2.03e-3 + 2.63e-10 x 536,870,912 = 2.03e-3 + 0.141197049856 = 0.143227049856 s
    #   bandwidth 5.22e9 + 19.4 x 536,870,912 = 15,635,295,692.8 B/s -> 0.0343371128 s
    #   total 0.1775641627 s
    assert costs.nvme_read_s(paper, m) == pytest.approx(0.17756416266463254, rel=1e-9)


# -- the paper's two paths, as bench/analytical_model.py has them -------------------------------------------

SIZES = [32 * KIB, 8 * MIB, 512 * MIB]  # up to 512 MiB: one chunk (the paper's chunk is 512 MiB)


@pytest.mark.parametrize("m", SIZES)
def test_the_paths_equal_the_analytical_model_with_the_nvme_write(paper, m):
    assert paper.transfer_ends == "nvme_write" and paper.chunk_bytes == 512 * MIB
    cpu = costs.cpu_centric_stages(paper, m)
    trig = costs.triggered_stages(paper, m)
    assert list(cpu) == ["gpu_to_host", "host_stack", "host_to_wire", "fabric", "nvme_write"]
    assert list(trig) == ["nic_dma", "fabric", "nvme_write"]
    assert sum(cpu.values()) == pytest.approx(am.cpu_centric_s(m), rel=1e-9)
    assert sum(trig.values()) == pytest.approx(am.triggered_s(m), rel=1e-9)
    # and stage by stage
    ref = am.cpu_chunk_stages(m, am.ModelParams())
    assert cpu["gpu_to_host"] == pytest.approx(ref["gpu_to_host"], rel=1e-9)
    assert cpu["host_stack"] == pytest.approx(ref["host_stack"], rel=1e-9)
    assert cpu["host_to_wire"] == pytest.approx(ref["host_to_wire"], rel=1e-9)
    assert cpu["nvme_write"] == pytest.approx(ref["nvme_write"], rel=1e-9)


@pytest.mark.parametrize("m", SIZES)
def test_when_the_queue_ends_a_triggered_transfer_its_nvme_write_is_off_its_path_not_the_cpus(paper, m):
    """The CPU-centric host thread waits for each store's acknowledgement, after the write, either way."""
    queued = paper.with_transfer_ends("nvme_queue")
    cpu = costs.cpu_centric_stages(queued, m)
    trig = costs.triggered_stages(queued, m)
    assert "nvme_write" in cpu and "nvme_write" not in trig
    no_nvme = am.ModelParams(include_nvme=False)
    assert sum(cpu.values()) == pytest.approx(am.cpu_centric_s(m), rel=1e-9)
    assert sum(trig.values()) == pytest.approx(am.triggered_s(m, no_nvme), rel=1e-9)


def test_the_cpu_centric_path_at_32_kib_by_hand(paper):
    m = 32 * KIB
    # gpu_to_host  3.2e-8 + 32,768 x 8.12e-12            = 2.9807616e-7
    # host_stack   32,768 x (1.21e-12 + 4.55e-13)        = 5.455872e-8
    # host_to_wire 3.2e-8 + 32,768 x 5.13e-11            = 1.7129984e-6
    # fabric       1.21e-12
    # nvme_write   (above)                               = 3.32743696e-3
    # sum                                                = 3.32950259e-3 s
    assert sum(costs.cpu_centric_stages(paper, m).values()) == pytest.approx(3.32950259e-3, rel=1e-8)


# -- path_s: serial and pipelined ----------------------------------------------------------------------------

def test_path_s_serial_adds_everything():
    blocks = [{"a": 1.0, "b": 3.0, "c": 2.0}] * 2
    assert costs.path_s(blocks, pipelined=False) == 12.0  # 2 x (1 + 3 + 2)


def test_path_s_pipelined_overlaps_the_stages():
    blocks = [{"a": 1.0, "b": 3.0, "c": 2.0}] * 2
    # block 1: a 0-1, b 1-4, c 4-6; block 2: a 1-2, b waits for b: 4-7, c 7-9 -> 9
    # (= the first block's 6 + one bottleneck stage of 3)
    assert costs.path_s(blocks, pipelined=True) == 9.0


def test_path_s_pipelined_with_unequal_blocks():
    blocks = [{"a": 2.0, "b": 1.0}, {"a": 1.0, "b": 3.0}]
    # block 1: a 0-2, b 2-3; block 2: a 2-3, b max(3, 3)-6 -> 6 (serial: 3 + 4 = 7)
    assert costs.path_s(blocks, pipelined=True) == 6.0
    assert costs.path_s(blocks, pipelined=False) == 7.0
    assert costs.path_s([], pipelined=True) == 0.0
