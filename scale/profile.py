"""Hardware profiles: read and checked from `deploy/profiles/NAME.yaml` (or any path).

A profile is data: the GPU (a roofline: peak FLOP/s, memory bandwidth, their efficiencies, a launch
overhead per step), links (a latency and a bandwidth each), the NVMe drive (Table II/III's form: a
latency `a + b m` and a bandwidth `base + slope m`), the NIC's trigger latency, and the virtual
model whose geometry is charged. Every value in the files carries its source in a comment.
Pure apart from `load` reading the file.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

PROFILES_ENV = "KVTB_PROFILES_DIR"
TRANSFER_ENDS = ("nvme_write", "nvme_queue")


class ProfileError(ValueError):
    """A profile is missing, unknown, or has a wrong or missing value."""


def _check(condition: object, message: str) -> None:
    if not condition:
        raise ProfileError(message)


@dataclass(frozen=True)
class VirtualModel:
    """The geometry whose costs are charged (the real model still computes every token)."""

    name: str
    params: float            # parameters, for FLOPs (2 per parameter per token) and weight bytes
    layers: int
    heads: int               # query heads
    kv_heads: int
    head_dim: int
    weight_bytes: float = 2  # bytes per parameter (fp16/bf16: 2)
    kv_bytes: float = 2      # bytes per KV element

    def __post_init__(self):
        for name in ("params", "layers", "heads", "kv_heads", "head_dim", "weight_bytes", "kv_bytes"):
            _check(getattr(self, name) > 0, f"model.{name} must be positive")

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @property
    def weights_bytes(self) -> float:
        return self.params * self.weight_bytes


@dataclass(frozen=True)
class Gpu:
    """A roofline: a step costs max(FLOPs / (peak x eff), bytes / (bandwidth x eff)) + launch."""

    name: str
    peak_flops: float
    flops_efficiency: float
    mem_bytes_per_s: float
    mem_efficiency: float
    launch_s: float = 0.0
    memory_bytes: float = 0.0

    def __post_init__(self):
        _check(self.peak_flops > 0 and self.mem_bytes_per_s > 0, "gpu peak_flops and mem_bytes_per_s must be positive")
        _check(0 < self.flops_efficiency <= 1 and 0 < self.mem_efficiency <= 1,
               "gpu efficiencies must be in (0, 1]")
        _check(self.launch_s >= 0, "gpu.launch_s must not be negative")


@dataclass(frozen=True)
class Link:
    """A copy over one link: latency_s + bytes / bytes_per_s (inf: no per-byte cost)."""

    latency_s: float
    bytes_per_s: float

    def __post_init__(self):
        _check(self.latency_s >= 0, "a link's latency_s must not be negative")
        _check(self.bytes_per_s > 0, "a link's bytes_per_s must be positive (.inf for none)")


@dataclass(frozen=True)
class NvmeOp:
    """One direction of an NVMe drive, in the paper's form (Tables II and III):
    T(m) = latency_s + latency_s_per_byte m + m / (bytes_per_s + bytes_per_s_per_byte m)."""

    latency_s: float
    latency_s_per_byte: float
    bytes_per_s: float
    bytes_per_s_per_byte: float = 0.0

    def __post_init__(self):
        _check(self.latency_s >= 0 and self.latency_s_per_byte >= 0, "nvme latencies must not be negative")
        _check(self.bytes_per_s > 0 and self.bytes_per_s_per_byte >= 0, "nvme bandwidth must be positive")


@dataclass(frozen=True)
class Nvme:
    write: NvmeOp
    read: NvmeOp
    queue_depth: int = 1  # commands the drive serves at once (1: one after another, the paper's pipeline stage)

    def __post_init__(self):
        _check(self.queue_depth >= 1, "nvme.queue_depth must be at least 1")


# The links a profile may name, and where each is charged.
LINKS = {
    "gpu_to_host": "a copy from GPU memory to host memory (cudaMemcpy D2H: swap-out, the CPU-centric copy)",
    "host_to_gpu": "a copy from host memory to GPU memory (swap-in)",
    "host_stack": "the host network stack's pass over the bytes (the CPU-centric path)",
    "host_to_wire": "the NIC's DMA from host memory onto the wire (the CPU-centric path)",
    "nic_dma": "the NIC's peer-to-peer DMA from GPU memory onto the wire (a triggered PUT), or back (a GET)",
    "fabric": "the fabric between the compute node's NIC and the storage node's",
}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: VirtualModel | None  # None: bytes are charged as they are (the paper's sizes are sizes)
    gpu: Gpu | None
    links: Mapping[str, Link]
    nvme: Nvme
    trigger_latency_s: float = 0.0
    chunk_bytes: int = 0               # the transfer unit the profile's system moves (0: the testbed's block)
    transfer_ends: str = "nvme_write"  # where a transfer ends: after the NVMe write, or when its queue accepted it
    sources: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.links) - set(LINKS)
        _check(not unknown, f"profile {self.name}: unknown links {sorted(unknown)} (known: {sorted(LINKS)})")
        _check(self.transfer_ends in TRANSFER_ENDS, f"transfer_ends must be one of {TRANSFER_ENDS}")
        fabric = self.links.get("fabric")
        _check(fabric is None or math.isinf(fabric.bytes_per_s),
               f"profile {self.name}: links.fabric.bytes_per_s must be .inf: a NIC streams onto the wire "
               "cut-through, so the wire's rate is part of nic_dma's and host_to_wire's bandwidth")
        _check(self.trigger_latency_s >= 0 and self.chunk_bytes >= 0,
               "trigger_latency_s and chunk_bytes must not be negative")

    def link(self, name: str) -> Link:
        try:
            return self.links[name]
        except KeyError:
            raise ProfileError(f"profile {self.name} has no link {name!r} ({LINKS.get(name, 'unknown')})") from None

    def with_transfer_ends(self, ends: str) -> "Profile":
        return dataclasses.replace(self, transfer_ends=ends)

    def kv_scale(self, real_kv_bytes_per_token: float) -> float:
        """Virtual KV bytes per real KV byte: transfers are charged for the virtual model's KV of the
        tokens moved (1 without a virtual model)."""
        if self.model is None:
            return 1.0
        _check(real_kv_bytes_per_token > 0, "real_kv_bytes_per_token must be positive")
        return self.model.kv_bytes_per_token / real_kv_bytes_per_token


def _float(value: Any, where: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ProfileError(f"{where}: expected a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ProfileError(f"{where}: expected a number, got {value!r}")
    return float(value)


def _build(cls, data: Any, where: str, numbers: tuple[str, ...] = ()):
    if not isinstance(data, Mapping):
        raise ProfileError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    _check(not unknown, f"{where}: unknown keys {sorted(unknown)}")
    kwargs = {k: (_float(v, f"{where}.{k}") if k in numbers else v) for k, v in data.items()}
    for f in dataclasses.fields(cls):
        if f.name in kwargs and f.type in ("int", int):
            kwargs[f.name] = _whole(kwargs[f.name], f"{where}.{f.name}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProfileError(f"{where}: {exc}") from None
    except ProfileError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def _whole(value: Any, where: str) -> int:
    number = _float(value, where)
    if number != int(number):
        raise ProfileError(f"{where}: expected a whole number, got {value!r}")
    return int(number)


def from_mapping(data: Mapping[str, Any], name: str = "") -> Profile:
    """A Profile from a parsed YAML mapping; ProfileError says what is wrong."""
    if not isinstance(data, Mapping):
        raise ProfileError("a profile is a mapping")
    known = {"name", "description", "model", "gpu", "links", "nvme", "trigger_latency_s", "chunk_bytes",
             "transfer_ends", "sources"}
    unknown = set(data) - known
    _check(not unknown, f"profile {name}: unknown keys {sorted(unknown)}")
    for key in ("links", "nvme"):
        _check(key in data, f"profile {name}: {key} is missing")
    model = data.get("model")
    model = None if model is None else _build(
        VirtualModel, model, "model", ("params", "weight_bytes", "kv_bytes"))
    gpu = data.get("gpu")
    gpu = None if gpu is None else _build(
        Gpu, gpu, "gpu", ("peak_flops", "flops_efficiency", "mem_bytes_per_s", "mem_efficiency", "launch_s",
                          "memory_bytes"))
    links_data = data["links"]
    _check(isinstance(links_data, Mapping), "links: expected a mapping")
    links = {k: _build(Link, v, f"links.{k}", ("latency_s", "bytes_per_s")) for k, v in links_data.items()}
    nvme_data = data["nvme"]
    _check(isinstance(nvme_data, Mapping), "nvme: expected a mapping")
    unknown = set(nvme_data) - {"write", "read", "queue_depth"}
    _check(not unknown, f"nvme: unknown keys {sorted(unknown)} (known: write, read, queue_depth)")
    op_numbers = ("latency_s", "latency_s_per_byte", "bytes_per_s", "bytes_per_s_per_byte")
    _check("write" in nvme_data and "read" in nvme_data, "nvme: write and read are both needed")
    nvme = Nvme(_build(NvmeOp, nvme_data["write"], "nvme.write", op_numbers),
                _build(NvmeOp, nvme_data["read"], "nvme.read", op_numbers),
                _whole(nvme_data.get("queue_depth", 1), "nvme.queue_depth"))
    return Profile(name=str(data.get("name") or name), description=str(data.get("description", "")),
                   model=model, gpu=gpu, links=links, nvme=nvme,
                   trigger_latency_s=_float(data.get("trigger_latency_s", 0.0), "trigger_latency_s"),
                   chunk_bytes=int(_float(data.get("chunk_bytes", 0), "chunk_bytes")),
                   transfer_ends=str(data.get("transfer_ends", "nvme_write")),
                   sources=dict(data.get("sources") or {}))


def profiles_dir() -> Path:
    """$KVTB_PROFILES_DIR, else the repository's deploy/profiles."""
    env = os.environ.get(PROFILES_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[1] / "deploy" / "profiles"


def available() -> list[str]:
    d = profiles_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def path_of(name_or_path: str) -> Path:
    """A profile's file: a path to a .yaml, or a name in profiles_dir()."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        path = Path(name_or_path)
    else:
        path = profiles_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        names = ", ".join(available()) or "none"
        raise ProfileError(f"no hardware profile {name_or_path!r} (known: {names}; or a path to a .yaml)")
    return path


def load(name_or_path: str) -> Profile:
    path = path_of(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {path} is not valid YAML: {exc}") from None
    return from_mapping(data or {}, path.stem)
