"""scale.profile: the three profiles load, and a wrong profile is refused with a message that helps."""
from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from scale import profile as pf

NAMES = ("h100-nvme", "paper", "polaris-a100")


@pytest.fixture
def data() -> dict:
    """polaris-a100 as parsed YAML, to break one thing at a time."""
    return copy.deepcopy(yaml.safe_load(pf.path_of("polaris-a100").read_text()))


def refused(data: dict, match: str) -> pf.ProfileError:
    with pytest.raises(pf.ProfileError, match=match) as info:
        pf.from_mapping(data, "broken")
    return info.value


# -- the shipped profiles ---------------------------------------------------------------------------------

def test_the_three_profiles_load():
    assert set(NAMES) <= set(pf.available())
    loaded = {name: pf.load(name) for name in NAMES}
    for name, p in loaded.items():
        assert p.name == name and p.description
        assert p.transfer_ends in pf.TRANSFER_ENDS
        assert set(p.links) <= set(pf.LINKS)
        assert p.nvme.write.bytes_per_s > 0 and p.nvme.read.bytes_per_s > 0
    # the paper's: sizes are charged as they are, no GPU, 512 MiB chunks, Table III's NVMe
    paper = loaded["paper"]
    assert paper.model is None and paper.gpu is None and paper.chunk_bytes == 512 * 1024 * 1024
    assert (paper.nvme.write.latency_s, paper.nvme.write.bytes_per_s_per_byte) == (3.3e-3, 6.83)
    # the two hardware profiles charge Llama-2-7B on a GPU
    for name in ("polaris-a100", "h100-nvme"):
        p = loaded[name]
        assert p.gpu is not None and p.model is not None and p.model.layers == 32
        assert 0.3 <= p.gpu.flops_efficiency <= 0.8 and 0.6 <= p.gpu.mem_efficiency <= 0.95
        assert 0 <= p.gpu.launch_s <= 1e-3


def test_a_profile_loads_from_a_path(tmp_path):
    path = tmp_path / "mine.yaml"
    shutil.copy(pf.path_of("h100-nvme"), path)
    assert pf.load(str(path)).gpu.name == "H100-SXM5-80GB"


def test_the_profiles_dir_comes_from_the_environment(tmp_path, monkeypatch):
    shutil.copy(pf.path_of("paper"), tmp_path / "other.yaml")
    monkeypatch.setenv(pf.PROFILES_ENV, str(tmp_path))
    assert pf.available() == ["other"]
    assert pf.load("other").chunk_bytes == 512 * 1024 * 1024


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(pf.ProfileError) as info:
        pf.load("nope")
    message = str(info.value)
    assert "'nope'" in message
    for name in NAMES:
        assert name in message


# -- wrong profiles -----------------------------------------------------------------------------------------

def test_an_unknown_top_level_key(data):
    data["gpus"] = data.pop("gpu")
    refused(data, r"unknown keys \['gpus'\]")


def test_an_unknown_key_in_a_section_names_the_section(data):
    data["links"]["gpu_to_host"]["speed"] = 1
    refused(data, r"links\.gpu_to_host: unknown keys \['speed'\]")
    del data["links"]["gpu_to_host"]["speed"]
    data["gpu"]["tflops"] = 312
    refused(data, r"gpu: unknown keys \['tflops'\]")


def test_an_unknown_link_lists_the_known_links(data):
    data["links"]["warp_drive"] = {"latency_s": 0, "bytes_per_s": 1}
    error = refused(data, r"unknown links \['warp_drive'\]")
    assert "gpu_to_host" in str(error) and "nic_dma" in str(error)


def test_a_missing_nvme(data):
    del data["nvme"]
    refused(data, "nvme is missing")


def test_a_missing_nvme_direction(data):
    del data["nvme"]["read"]
    refused(data, "write and read are both needed")


def test_a_negative_latency(data):
    data["links"]["fabric"]["latency_s"] = -1e-6
    refused(data, "latency_s must not be negative")


def test_a_negative_nvme_latency(data):
    data["nvme"]["write"]["latency_s"] = -1
    refused(data, "nvme latencies must not be negative")


def test_a_negative_launch(data):
    data["gpu"]["launch_s"] = -3e-4
    refused(data, "launch_s must not be negative")


@pytest.mark.parametrize("value", ["fast", True, None, float("nan"), [1]])
def test_a_value_that_is_not_a_number(data, value):
    data["links"]["gpu_to_host"]["bytes_per_s"] = value
    refused(data, r"links\.gpu_to_host\.bytes_per_s: expected a number, got ")


def test_a_number_written_as_a_string_is_read(data):
    # PyYAML (YAML 1.1) reads 2.5e10 and 312e12 as strings (a float needs a dot and a signed exponent);
    # the profiles write numbers that way (peak_flops: 312e12)
    data["links"]["gpu_to_host"]["bytes_per_s"] = "2.5e10"
    assert pf.from_mapping(data, "ok").link("gpu_to_host").bytes_per_s == 2.5e10


def test_a_non_number_in_a_file_names_the_field(tmp_path, data):
    data["nvme"]["read"]["bytes_per_s"] = "quick"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(pf.ProfileError, match=r"nvme\.read\.bytes_per_s: expected a number, got 'quick'"):
        pf.load(str(path))


def test_an_efficiency_above_one(data):
    data["gpu"]["mem_efficiency"] = 1.2
    refused(data, r"efficiencies must be in \(0, 1\]")


def test_an_unknown_transfer_end(data):
    data["transfer_ends"] = "nvme_flush"
    refused(data, "transfer_ends must be one of")


def test_not_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("links: [unclosed\n")
    with pytest.raises(pf.ProfileError, match="not valid YAML"):
        pf.load(str(path))


# -- kv_scale and the rest ------------------------------------------------------------------------------

def test_kv_scale():
    polaris = pf.load("polaris-a100")
    # Llama-2-7B: 2 x 32 layers x 32 kv heads x 128 x 2 B = 524,288 B per token
    assert polaris.model.kv_bytes_per_token == 524_288
    # a real model of 131,072 B per token (2 x 16 layers x 16 kv heads x 128 x 2 B): each real byte is 4
    assert polaris.kv_scale(131_072) == 4.0
    assert polaris.kv_scale(524_288) == 1.0
    # no virtual model: the bytes are charged as they are
    assert pf.load("paper").kv_scale(131_072) == 1.0
    with pytest.raises(pf.ProfileError, match="must be positive"):
        polaris.kv_scale(0)


def test_with_transfer_ends_is_a_copy():
    paper = pf.load("paper")
    queued = paper.with_transfer_ends("nvme_queue")
    assert (paper.transfer_ends, queued.transfer_ends) == ("nvme_write", "nvme_queue")
    with pytest.raises(pf.ProfileError):
        paper.with_transfer_ends("somewhere")


def test_a_missing_link_is_named():
    with pytest.raises(pf.ProfileError, match="has no link 'host_to_gpu'"):
        pf.load("paper").link("host_to_gpu")


# -- found while writing these tests, fixed -----------------------------------------------------------

def test_an_unknown_nvme_key(data):
    data["nvme"]["queue_dept"] = 4  # meant queue_depth: silently 1
    refused(data, r"nvme: unknown keys \['queue_dept'\]")


def test_a_queue_depth_that_is_not_a_whole_number(data):
    data["nvme"]["queue_depth"] = "two"
    refused(data, r"nvme\.queue_depth")
