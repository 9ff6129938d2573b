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
as swarm secrets (made on the deploying host by `kvtb credentials init deploy/credentials --replicas 2`,
which `make stack-up` runs), mounted in /run/secrets: its certificate and key (its identity: the
KVTB_<KIND>_IDENTITY its environment gives, else its kind), the CA, and the fabric and KV keys only
where they are used.

Monitoring: the Prometheus of the compose profile `monitoring` is not in the stack. Its image is built on
the deploying host only (`make prometheus-image`), its scrape configuration names the compose project's
services one target each, and a swarm has no profiles: it would run on every deployment. A swarm's
operator points the Prometheus they run at the services' metrics ports (0.0.0.0 in every container) or
at the frontend's API port with a metrics reader's token (deploy/prometheus/prometheus.yml shows both).

Replicas: every agent and compute node pair of the compose file is in the stack, each on a node
labelled `kvtb.compute=true`; the second (compose profile `replicas`) starts with 0 tasks and is
scaled with the stack (`docker service scale kvtb_smartnic1=1 kvtb_compute1=1`; back to 0 takes it
away). The stack's frontend lists every pair (KVTB_FRONTEND_REPLICAS, unless the deploying shell
sets it) and its health checks put a pair in the rotation once it answers; a pair of 0 tasks resolves
to no address (endpoint_mode dnsrr), so the frontend's probe fails at once rather than at a timeout.

usage: python deploy/stack_file.py [--check]
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "docker-compose.yml"
TARGET = HERE / "docker-stack.yml"
COLOCATED = ("compute", "smartnic")   # kinds: each pair (compute, smartnic; compute1, smartnic1) on a kvtb.compute host
AGENT_PORT = 50051                      # the agents' listen port (kvtb.compose.yaml)
SCALED_PROFILE = "replicas"             # the compose profile of the pairs the stack scales (0 tasks at first)
LEFT_OUT_PROFILE = "monitoring"         # the compose profile whose services the stack has not (Prometheus)
CONFIG_FILE = "kvtb.compose.yaml"
CONFIG_TARGET = "/etc/kvtb/kvtb.yaml"
HEADER = "# Generated from docker-compose.yml by deploy/stack_file.py; do not edit by hand.\n"
CREDENTIALS_SERVICE = "credentials"
SECRETS_DIR = "/run/secrets"
# The keys each kind of service is given besides the CA and its own certificate and key
# (kvtb.credentials names the files).
KEYS = {"storage": ("fabric.key",), "smartnic": ("fabric.key", "kv-mac.key"),
        "compute": ("fabric.key", "kv-mac.key"), "frontend": ()}


def _kind(name: str) -> str | None:
    """The kind of a compose service ("storage0" -> "storage", "smartnic1" -> "smartnic"; None: none)."""
    return next((kind for kind in KEYS if name.startswith(kind)), None)


def _identity(name: str, service: dict) -> str | None:
    """The credentials identity of a compose service: its KVTB_<KIND>_IDENTITY, else its kind (None: none)."""
    kind = _kind(name)
    if kind is None:
        return None
    return str((service.get("environment") or {}).get(f"KVTB_{kind.upper()}_IDENTITY") or kind)


def _secret_files(name: str, service: dict) -> tuple[str, ...]:
    identity = _identity(name, service)
    return ("ca.crt", f"{identity}.crt", f"{identity}.key", *KEYS[_kind(name)]) if identity else ()


def replica_list(services: dict) -> str:
    """KVTB_FRONTEND_REPLICAS naming every agent of the file ("replica-0=smartnic:50051=smartnic,...")."""
    agents = [(name, s) for name, s in services.items() if _kind(name) == "smartnic"]
    return ",".join(f"{(s.get('environment') or {}).get('KVTB_SMARTNIC_REPLICA') or 'replica-0'}="
                    f"{name}:{AGENT_PORT}={_identity(name, s)}" for name, s in agents)


def _secret(file: str) -> str:
    return "kvtb_" + file.replace(".", "_").replace("-", "_")


def _volume_names(service: dict) -> set[str]:
    return {str(v).split(":", 1)[0] for v in service.get("volumes", [])}


def stack_config(compose: dict) -> dict:
    """The stack form of a parsed compose file."""
    left_out = {name for name, service in compose["services"].items()
                if LEFT_OUT_PROFILE in (service.get("profiles") or ())}
    kept = [s for name, s in compose["services"].items() if name not in left_out]
    theirs = set().union(*(_volume_names(compose["services"][name]) for name in left_out)) - \
        set().union(*(_volume_names(s) for s in kept))
    volumes = {k: v for k, v in compose.get("volumes", {}).items()
               if k != CREDENTIALS_SERVICE and k not in theirs}
    files = sorted({f for name, service in compose["services"].items() for f in _secret_files(name, service)})
    out = {"version": compose.get("version", "3.8"), "services": {}, "volumes": volumes,
           "configs": {"kvtb_config": {"file": "./" + CONFIG_FILE}},
           "secrets": {_secret(f): {"file": f"./{CREDENTIALS_SERVICE}/{f}"} for f in files}}
    for name, service in compose["services"].items():
        if name == CREDENTIALS_SERVICE or name in left_out:
            continue
        service = dict(service)
        volumes = [v for v in service.get("volumes", []) if not str(v).startswith("./" + CONFIG_FILE)
                   and not str(v).startswith(CREDENTIALS_SERVICE + ":")]
        service["volumes"] = volumes
        service["configs"] = [{"source": "kvtb_config", "target": CONFIG_TARGET, "mode": 0o444}]
        if _identity(name, service) is not None:
            service["secrets"] = [{"source": _secret(f), "target": f, "mode": 0o400}
                                  for f in _secret_files(name, service)]
            env = dict(service.get("environment") or {})
            env["KVTB_CREDENTIALS_DIR"] = SECRETS_DIR
            service["environment"] = env
        scaled = SCALED_PROFILE in (service.get("profiles") or ())
        if isinstance(service.get("depends_on"), dict):
            service["depends_on"] = sorted(set(service["depends_on"]) - {CREDENTIALS_SERVICE})
        if not service.get("depends_on"):
            service.pop("depends_on", None)
        for key in ("ipc", "profiles", "shm_size", "init", "cpuset"):
            service.pop(key, None)
        if service.get("ports"):
            service["ports"] = [_host_mode(p) for p in service["ports"]]
        if _kind(name) in COLOCATED:
            env = dict(service.get("environment") or {})
            env["KVTB_SHM_DIR"] = "/kvpool"
            service["environment"] = env
            deploy = dict(service.get("deploy") or {})
            deploy["placement"] = {"constraints": ["node.labels.kvtb.compute == true"]}
            if scaled:
                deploy.update({"replicas": 0, "endpoint_mode": "dnsrr"})
            service["deploy"] = deploy
        if _kind(name) == "frontend":
            env = dict(service.get("environment") or {})
            env["KVTB_FRONTEND_REPLICAS"] = "${KVTB_FRONTEND_REPLICAS:-%s}" % replica_list(compose["services"])
            service["environment"] = env
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
