"""`--profile` and `--dilation` for every benchmark and study: a run under a hardware profile.

`add_profile_args` adds the options; `apply(args)` checks the profile, puts it (and D) in this
process (an in-process agent paces too) and in the environment every service the run starts
inherits (KVTB_SCALE_*), and stretches the services' deadlines by D (a dilated run takes D times as
long in wall time). `record(...)` is what a result says about it: the profile, D, and the
violations per operation kind, merged over the processes. Virtual time is wall / D.

Without `--profile` nothing changes: no variable is set, nothing is paced.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator, Mapping

from scale import dilation as dl
from scale import profile as pf
from scale import settings as scale_settings

# Deadlines and intervals of the services that a dilated run must stretch by D (section, field, cap or
# None): each is in virtual seconds.
DEADLINES = (("smartnic", "get_timeout_s", None), ("smartnic", "fabric_timeout_s", None),
             ("smartnic", "discovery_timeout_s", 60.0), ("compute", "restore_timeout_s", None),
             ("compute", "drain_timeout_s", None), ("compute", "restore_layer_wait_s", None),
             ("frontend", "agent_timeout_s", None), ("frontend", "health_timeout_s", 600.0),
             ("frontend", "queue_timeout_s", None), ("frontend", "health_interval_s", 120.0))
DEFAULTS = {"get_timeout_s": 3.0, "fabric_timeout_s": 5.0, "discovery_timeout_s": 1.0, "restore_timeout_s": 10.0,
            "drain_timeout_s": 10.0, "restore_layer_wait_s": 1.0, "agent_timeout_s": 300.0,
            "health_timeout_s": 2.0, "queue_timeout_s": 600.0,
            "health_interval_s": 1.0}
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # the real model's fp32 KV per token: 46,080 bytes


def add_profile_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--profile", default="",
                        help="a hardware profile (deploy/profiles: " + ", ".join(pf.available()) + ", or a .yaml "
                             "path): every modeled operation takes max(real, D x modeled) and times are "
                             "reported in virtual time (wall / D). Default: none, real time here")
    parser.add_argument("--dilation", default="auto",
                        help="D under --profile: a number >= 1, or auto (from a short warm-up; default)")
    return parser


def parse_dilation(value: str) -> float | None:
    """None for auto; a number checked by scale.dilation."""
    if str(value).strip().lower() == "auto":
        return None
    return dl.check_dilation(value)


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> pf.Profile | None:
    """The profile named by --profile, or a parser error saying what is wrong (before anything starts)."""
    args.dilation_value = None
    if not getattr(args, "profile", ""):
        return None
    try:
        profile = pf.load(args.profile)
        args.dilation_value = parse_dilation(args.dilation)
    except (pf.ProfileError, dl.DilationError) as exc:
        parser.error(str(exc))
    return profile


def deadlines_env(dilation: float) -> dict[str, str]:
    out = {}
    for section, field, cap in DEADLINES:
        value = DEFAULTS[field] * dilation
        out[f"KVTB_{section.upper()}_{field.upper()}"] = repr(min(value, cap) if cap else value)
    return out


def apply(profile: str, dilation: float, transfer_ends: str = "",
          real_kv_bytes_per_token: int = SMOLLM2_KV_BYTES_PER_TOKEN, environ: dict | None = None,
          kv_scale: float = 0.0) -> dl.Pacer:
    """Run under `profile` at D = dilation from now on: this process and the services it starts
    (kv_scale > 0: every transfer charged for that many bytes per real byte, whatever the model)."""
    environ = os.environ if environ is None else environ
    env = scale_settings.environment(profile, dilation, transfer_ends, real_kv_bytes_per_token, kv_scale)
    env |= deadlines_env(dilation)
    environ.update(env)
    settings = scale_settings.ScaleSettings(profile, dilation, transfer_ends, real_kv_bytes_per_token, kv_scale)
    _, pacer = scale_settings.install_from(settings)
    return pacer


def clear(environ: dict | None = None) -> None:
    """Back to real time: this process and the services started from now on."""
    environ = os.environ if environ is None else environ
    for key in [k for k in environ if k.startswith("KVTB_SCALE_")] + list(deadlines_env(1.0)):
        environ.pop(key, None)
    scale_settings.install_from(scale_settings.ScaleSettings())


def record(profile: pf.Profile, dilation: float, snapshots: list[Mapping | None], how: str) -> dict:
    """What a result says of its scale model: profile, D (and how it was chosen), the violations."""
    merged = dl.merge([s for s in snapshots if s])
    return {"profile": profile.name, "description": profile.description, "dilation": dilation,
            "dilation_chosen": how, "times": "virtual (wall / D)", "pacing": merged,
            "violation_fraction": merged["violation_fraction"],
            "invalid_kinds": dl.invalid_kinds(merged)}


def choose_dilation(profile: pf.Profile, given: float | None, smoke: bool,
                    torch_threads: int = 0) -> tuple[float, str, dict | None]:
    """D of a study's run: the number given, or auto: `kvtb profile check`'s warm-up (the real model's
    steps at the compute node's threads, the copies), the worst kind x 2. (D, how, the warm-up's report)."""
    if given is not None:
        return given, "given", None
    from bench import profile_check
    report = profile_check.check(profile, quick=smoke, margin=2.0, repeats=3, threads=torch_threads)
    return report["dilation"], f"auto: {report['dilation_set_by']}", report


def storage_pacing(storage, credentials_dir: str | os.PathLike | None = None) -> dict:
    """A storage node's (a ServiceProcess) pacer snapshot, over its admin port ({} in real time), as the
    operator of the deployment whose credentials are in credentials_dir (default: this process's)."""
    import json

    from bench.stack import operator_channel
    from kvtb_proto import storage_admin_pb2, storage_admin_pb2_grpc

    with operator_channel(storage.addresses["admin"], peer="storage", credentials_dir=credentials_dir) as channel:
        stats = storage_admin_pb2_grpc.StorageAdminStub(channel).Stats(storage_admin_pb2.StatsRequest(), timeout=30)
    return json.loads(stats.pacing_json) if stats.pacing_json else {}


def frontend_pacing(address: str) -> dict:
    """The frontend's pacer snapshot (its software's CPU time, stretched by D), from its SystemStats."""
    from chat_client.client import FrontendClient

    client = FrontendClient(address, "", timeout_s=30.0)
    try:
        return client.system_stats().get("frontend", {}).get("pacing") or {}
    finally:
        client.close()


def stack_pacing(stack, compute: bool = True, frontend: bool = False) -> list[dict]:
    """The pacers' snapshots of a bench.stack.Stack's services: every replica's agent (and compute node),
    each storage node, and the frontend if asked. A service that cannot say is logged and left out."""
    import logging

    from kvtb_proto import smartnic_pb2, smartnic_pb2_grpc

    def agent(i: int) -> dict:
        with stack.replica_channel(i) as ch:
            return _json(smartnic_pb2_grpc.SmartNicStub(ch).Stats(smartnic_pb2.StatsRequest(), timeout=10).pacing_json)

    gets = []
    for i in range(stack.replicas):
        gets.append(lambda i=i: agent(i))
        if compute:
            gets.append(lambda i=i: _json(stack.compute_stats(i).pacing_json))
    gets += [lambda proc=proc: storage_pacing(proc, stack.deployment.credentials_dir) for proc in stack.deployment.procs
             if proc.name.startswith("storage")]
    if frontend:
        gets.append(lambda: frontend_pacing(stack.frontend))
    snaps = []
    for get in gets:
        try:
            snaps.append(get())
        except Exception as exc:  # noqa: BLE001 - a service that cannot say is reported as such
            logging.getLogger(__name__).warning("pacing stats: %s", exc)
    return [s for s in snaps if s]


def _json(text: str) -> dict:
    import json
    return json.loads(text) if text else {}


@contextlib.contextmanager
def virtual_clock(dilation: float) -> Iterator[None]:
    """Within it, this process's time.perf_counter and time.monotonic run at 1/D: what a benchmark times
    with them is virtual time (wall / D), and its asyncio timers and client timeouts are virtual
    seconds too (D x as long in wall time, as the services' deadlines are). Pacers keep the wall clock
    (scale.dilation.Pacer binds the real one). D = 1: nothing changes."""
    if dilation == 1.0:
        yield
        return
    real_perf, real_mono = time.perf_counter, time.monotonic
    origin_perf, origin_mono = real_perf(), real_mono()
    time.perf_counter = lambda: origin_perf + (real_perf() - origin_perf) / dilation
    time.monotonic = lambda: origin_mono + (real_mono() - origin_mono) / dilation
    try:
        yield
    finally:
        time.perf_counter, time.monotonic = real_perf, real_mono


def scale_line(record: Mapping | None) -> str:
    """A benchmark's word on its scale model, for the top of its tables ("" in real time)."""
    if not record:
        return ""
    pacing = record.get("pacing") or {}
    bad = record.get("invalid_kinds") or []
    return (f"under hardware profile `{record['profile']}`: times are virtual (wall / D), D = {record['dilation']:.3g} "
            f"({record.get('dilation_chosen', '')}); {pacing.get('violations', 0)} of {pacing.get('ops', 0)} paced "
            f"operations violated their budget" + (f"; kinds over 1%: {', '.join(bad)} (figures depending on them "
                                                   f"are not valid)" if bad else ""))
