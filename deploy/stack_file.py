"""Write deploy/docker-stack.yml: the compose file in the form `docker stack deploy` accepts.

Swarm's loader refuses what docker-compose needs for ordered start-up (`depends_on` with
`condition: service_healthy`) and ignores `ipc`. So the stack file is derived from the one
compose file instead of being kept by hand: `depends_on` becomes a plain list (services retry
until their peers answer), `ipc` and `profiles` go, the KV pool is shared through the `kvpool`
tmpfs volume (KVTB_SHM_DIR=/kvpool), and the compute node and its SmartNIC agent are placed on
the same host (a node labelled `kvtb.compute=true`), as a GPU and its NIC are, and the config
file travels as a swarm config (so that every host has it) instead of a bind mount, and ports
are published on the host that runs the frontend (mode host) rather than through the mesh.
Swarm has no `cpuset`: it goes, and each service pins itself to its KVTB_<SECTION>_CPUS
(kvtb.placement), which the stack file passes on from the deploying shell as the compose file does.
The one-shot `credentials` service goes too: on a swarm each service gets its own credentials
as swarm secrets (made on the deploying host by `kvtb credentials init deploy/credentials`,
which `make stack-up` runs), mounted in /run/secrets: its certificate and key, the CA, and the
fabric and KV keys only where they are used.

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
CREDENTIALS_SERVICE = "credentials"
SECRETS_DIR = "/run/secrets"
# The credentials each service is given (kvtb.credentials names the files).
SECRETS = {"storage": ("ca.crt", "storage.crt", "storage.key", "fabric.key"),
           "smartnic": ("ca.crt", "smartnic.crt", "smartnic.key", "fabric.key", "kv-mac.key"),
           "compute": ("ca.crt", "compute.crt", "compute.key", "fabric.key", "kv-mac.key"),
           "frontend": ("ca.crt", "frontend.crt", "frontend.key")}


def _identity(name: str) -> str | None:
    """The credentials identity of a compose service ("storage0" -> "storage"; None: none)."""
    return next((identity for identity in SECRETS if name.startswith(identity)), None)


def _secret(file: str) -> str:
    return "kvtb_" + file.replace(".", "_").replace("-", "_")


def stack_config(compose: dict) -> dict:
    """The stack form of a parsed compose file."""
    volumes = {k: v for k, v in compose.get("volumes", {}).items() if k != CREDENTIALS_SERVICE}
    files = sorted({f for group in SECRETS.values() for f in group})
    out = {"version": compose.get("version", "3.8"), "services": {}, "volumes": volumes,
           "configs": {"kvtb_config": {"file": "./" + CONFIG_FILE}},
           "secrets": {_secret(f): {"file": f"./{CREDENTIALS_SERVICE}/{f}"} for f in files}}
    for name, service in compose["services"].items():
        if name == CREDENTIALS_SERVICE:
            continue
        service = dict(service)
        volumes = [v for v in service.get("volumes", []) if not str(v).startswith("./" + CONFIG_FILE)
                   and not str(v).startswith(CREDENTIALS_SERVICE + ":")]
        service["volumes"] = volumes
        service["configs"] = [{"source": "kvtb_config", "target": CONFIG_TARGET, "mode": 0o444}]
        identity = _identity(name)
        if identity is not None:
            service["secrets"] = [{"source": _secret(f), "target": f, "mode": 0o400} for f in SECRETS[identity]]
            env = dict(service.get("environment") or {})
            env["KVTB_CREDENTIALS_DIR"] = SECRETS_DIR
            service["environment"] = env
        if isinstance(service.get("depends_on"), dict):
            service["depends_on"] = sorted(set(service["depends_on"]) - {CREDENTIALS_SERVICE})
        if not service.get("depends_on"):
            service.pop("depends_on", None)
        for key in ("ipc", "profiles", "shm_size", "init", "cpuset"):
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
