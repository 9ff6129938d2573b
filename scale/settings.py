"""Section `scale` of the config file, read by every service: the profile and the dilation of a run.

    scale:
      profile: polaris-a100   # a name in deploy/profiles, or a path; "" (the default): real time
      dilation: 40            # D; a number (`--dilation auto` is resolved before the services start)

or KVTB_SCALE_PROFILE / KVTB_SCALE_DILATION in the environment, which the benchmarks and studies set
for the services they start.
"""
from __future__ import annotations

import dataclasses
import os

from kvtb.settings import load_settings, require
from scale import dilation as dl
from scale import profile as pf

SECTION = "scale"
ENV_PROFILE, ENV_DILATION = "KVTB_SCALE_PROFILE", "KVTB_SCALE_DILATION"


@dataclasses.dataclass(frozen=True)
class ScaleSettings:
    profile: str = ""
    dilation: float = 1.0
    transfer_ends: str = ""   # "" : the profile's; nvme_write or nvme_queue
    real_kv_bytes_per_token: int = 0  # the real model's KV per token, for a node that cannot see a layout
                                      # (the storage node); 0: bytes are charged as they are
    kv_scale: float = 0.0     # > 0: virtual bytes per real byte for every transfer (1: sizes are sizes);
                              # 0: the virtual model's KV per token over the real one's

    def __post_init__(self):
        dl.check_dilation(self.dilation)
        require(self.real_kv_bytes_per_token >= 0, "scale.real_kv_bytes_per_token must not be negative")
        require(self.kv_scale >= 0, "scale.kv_scale must not be negative")
        require(self.transfer_ends in ("", *pf.TRANSFER_ENDS),
                f"scale.transfer_ends must be empty or one of {pf.TRANSFER_ENDS}")


def load(config_path: str | None = None) -> ScaleSettings:
    return load_settings(ScaleSettings, SECTION, config_path)


def resources(profile: pf.Profile) -> tuple[str, ...]:
    """The profile's servers, one operation at a time each: the NVMe drive, the NIC's DMA engine, the GPU, the PCIe copy engine."""
    return ("nvme", "nic", "gpu", "pcie")


def pacer_of(settings: ScaleSettings) -> tuple[pf.Profile | None, dl.Pacer | None]:
    """The run's profile and pacer (None, None without a profile). ProfileError for a bad profile."""
    if not settings.profile:
        return None, None
    profile = pf.load(settings.profile)
    if settings.transfer_ends:
        profile = profile.with_transfer_ends(settings.transfer_ends)
    return profile, dl.Pacer(settings.dilation, resources=resources(profile), profile=profile.name)


def install_from(settings: ScaleSettings) -> tuple[pf.Profile | None, dl.Pacer | None]:
    """Set the process's profile and pacer (a service's main calls it once)."""
    global _real_kv_bytes_per_token, _kv_scale
    profile, pacer = pacer_of(settings)
    if profile is not None:  # the processes this one starts (the NIC's fast path) pace alike
        os.environ.update(environment(settings.profile, settings.dilation, settings.transfer_ends,
                                      settings.real_kv_bytes_per_token, settings.kv_scale))
    else:  # and in real time, so do they: nothing of an earlier profile is left for them to inherit
        for key in [k for k in os.environ if k.startswith("KVTB_SCALE_")]:
            del os.environ[key]
    _kv_scale = settings.kv_scale
    dl.install(pacer)
    _install_profile(profile)
    _real_kv_bytes_per_token = settings.real_kv_bytes_per_token
    return profile, pacer


def kv_scale_of(profile: pf.Profile, real_kv_bytes_per_token: int = 0) -> float:
    """Virtual bytes per real byte moved: from the given layout's KV per token, else the setting's."""
    if _kv_scale > 0:
        return _kv_scale
    real = real_kv_bytes_per_token or _real_kv_bytes_per_token
    return profile.kv_scale(real) if (real and profile.model is not None) else 1.0


def environment(profile: str, dilation: float, transfer_ends: str = "", real_kv_bytes_per_token: int = 0,
                kv_scale: float = 0.0) -> dict[str, str]:
    """What a launcher sets for the services it starts."""
    if not profile:
        return {}
    env = {ENV_PROFILE: profile, ENV_DILATION: repr(float(dilation))}
    if kv_scale:
        env["KVTB_SCALE_KV_SCALE"] = repr(float(kv_scale))
    if transfer_ends:
        env["KVTB_SCALE_TRANSFER_ENDS"] = transfer_ends
    if real_kv_bytes_per_token:
        env["KVTB_SCALE_REAL_KV_BYTES_PER_TOKEN"] = str(int(real_kv_bytes_per_token))
    return env


def from_environment() -> tuple[pf.Profile | None, dl.Pacer | None]:
    """install_from() with the environment alone (processes a study spawns without a config file)."""
    if not os.environ.get(ENV_PROFILE):
        return None, None
    return install_from(load_settings(ScaleSettings, SECTION, None))


_profile: pf.Profile | None = None
_real_kv_bytes_per_token = 0
_kv_scale = 0.0


def _install_profile(profile: pf.Profile | None) -> None:
    global _profile
    _profile = profile


def current_profile() -> pf.Profile | None:
    return _profile
