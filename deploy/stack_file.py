"""Write deploy/docker-stack.yml: the compose file in the form `docker stack deploy` accepts.

Swarm's loader refuses what docker-compose needs for ordered start-up (`depends_on` with
`condition: service_healthy`) and ignores `ipc`. So the stack file is derived from the one
compose file instead of being kept by hand: `depends_on` becomes a plain list (services retry
until their peers answer), `ipc` and `profiles` go, the KV pool is shared through the `kvpool`
tmpfs volume (KVTB_SHM_DIR=/kvpool), and the compute node and its SmartNIC agent are placed on
the same host (a node labelled `kvtb.compute=true`), as a GPU and its NIC are, and the config
file travels as a swarm config (so that every host has it) instead of a bind mount, and ports
are published on the host that runs the frontend (mode host) rather than through the mesh.

usage: python deploy/stack_file.py [--check]
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "docker-compose.yml"
TARGET = HERE / "docker-stack.yml"
COLOCATED = ("compute", "smartnic")
CONFIG_FILE = "kvtb.compose.yaml"
CONFIG_TARGET = "/etc/kvtb/kvtb.yaml"
HEADER = "# Generated from docker-compose.yml by deploy/stack_file.py; do not edit by hand.\n"


def stack_config(compose: dict) -> dict:
    """The stack form of a parsed compose file."""
    out = {"version": compose.get("version", "3.8"), "services": {}, "volumes": compose.get("volumes", {}),
           "configs": {"kvtb_config": {"file": "./" + CONFIG_FILE}}}
    for name, service in compose["services"].items():
        service = dict(service)
        volumes = [v for v in service.get("volumes", []) if not str(v).startswith("./" + CONFIG_FILE)]
        service["volumes"] = volumes
        service["configs"] = [{"source": "kvtb_config", "target": CONFIG_TARGET, "mode": 0o444}]
        if isinstance(service.get("depends_on"), dict):
            service["depends_on"] = sorted(service["depends_on"])
        for key in ("ipc", "profiles", "shm_size", "init"):
            service.pop(key, None)
        if service.get("ports"):
            service["ports"] = [_host_mode(p) for p in service["ports"]]
        if name in COLOCATED:
            env = dict(service.get("environment") or {})
            env["KVTB_SHM_DIR"] = "/kvpool"
            service["environment"] = env
            deploy = dict(service.get("deploy") or {})
            deploy["placement"] = {"constraints": ["node.labels.kvtb.compute == true"]}
            service["deploy"] = deploy
        out["services"][name] = service
    return out


def _host_mode(port: str) -> dict:
    """"HOST:CONTAINER" as a port published on the node running the task (mode host).

    The routing mesh (ingress) needs IPVS, which some hosts (containers, sandboxes) lack; a
    published port of mode host works everywhere, on the node the frontend runs on.
    """
    published, target = str(port).rsplit(":", 1)
    return {"target": int(target), "published": published, "protocol": "tcp", "mode": "host"}


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:
        return True


def render() -> str:
    compose = yaml.safe_load(SOURCE.read_text())
    return HEADER + yaml.dump(stack_config(compose), Dumper=_NoAliases, sort_keys=False)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run python deploy/stack_file.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
