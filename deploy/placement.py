"""Print the KVTB_<SECTION>_CPUS assignments of a placement on this host, for the compose file.

    python deploy/placement.py nic            # KVTB_STORAGE_CPUS=1 KVTB_SMARTNIC_CPUS=1 ...
    python deploy/placement.py nic --cpus 0-15
    python deploy/placement.py shared --replicas 2   # ... KVTB_COMPUTE_CPUS=0 KVTB_COMPUTE1_CPUS=1 ...

`make up PLACEMENT=nic` runs docker-compose with them in its environment: each service's cpuset
and its `cpus` setting (deploy/docker-compose.yml). The plan is kvtb.placement's, as `kvtb up
--placement` uses it; --cpus plans over a set other than this process's CPUs (another host's).
With --replicas 2 the second pair's (the compose file's smartnic1 and compute1, profile `replicas`) are
KVTB_SMARTNIC1_* and KVTB_COMPUTE1_CPUS: the compute CPUs split between the two compute nodes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtb import placement  # noqa: E402 - after the repository is on the path


def variable(service: str) -> str:
    """The compose file's variable stem of a plan's service: compute -> COMPUTE, compute-1 -> COMPUTE1."""
    return service.replace("-", "").upper()


def assignments(name: str, cpus: str = "", replicas: int = 1) -> dict[str, str]:
    """KVTB_<SERVICE>_CPUS -> its CPU list, for every service of placement `name` (replica i's pair:
    KVTB_SMARTNICi_*, KVTB_COMPUTEi_CPUS), and each agent's fast path settings for it
    (KVTB_SMARTNIC[i]_FASTPATH, _FASTPATH_CPUS, _WATCHER_BUSY_POLL, _WATCHER_NAP_US)."""
    plan = placement.plan(name, placement.parse_cpus(cpus) or None, replicas)
    out = {f"KVTB_{variable(service)}_CPUS": text for service, text in placement.formatted(plan).items()}
    for i in range(replicas):
        agent = placement.replica_services(i)[0]
        out.update({f"KVTB_{variable(agent)}_{field.upper()}": value
                    for field, value in placement.agent_settings_in(name, plan, agent).items()})
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="deploy/placement.py", description=__doc__.splitlines()[0])
    parser.add_argument("placement", choices=placement.PLACEMENTS)
    parser.add_argument("--cpus", default="", help="the CPUs to place on (default: this process's)")
    parser.add_argument("--replicas", type=int, default=1, choices=(1, 2),
                        help="agent and compute node pairs (the compose file has two)")
    args = parser.parse_args(argv)
    try:
        pairs = assignments(args.placement, args.cpus, args.replicas)
    except ValueError as exc:
        print(f"deploy/placement.py: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"{key}={value}" for key, value in pairs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
