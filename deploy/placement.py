"""Print the KVTB_<SECTION>_CPUS assignments of a placement on this host, for the compose file.

    python deploy/placement.py nic            # KVTB_STORAGE_CPUS=1 KVTB_SMARTNIC_CPUS=1 ...
    python deploy/placement.py nic --cpus 0-15

`make up PLACEMENT=nic` runs docker-compose with them in its environment: each service's cpuset
and its `cpus` setting (deploy/docker-compose.yml). The plan is kvtb.placement's, as `kvtb up
--placement` uses it; --cpus plans over a set other than this process's CPUs (another host's).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtb import placement  # noqa: E402 - after the repository is on the path


def assignments(name: str, cpus: str = "") -> dict[str, str]:
    """KVTB_<SECTION>_CPUS -> its CPU list, for every service of placement `name`, and the agent's fast
    path settings for it (KVTB_SMARTNIC_FASTPATH, KVTB_SMARTNIC_WATCHER_BUSY_POLL)."""
    plan = placement.plan(name, placement.parse_cpus(cpus) or None)
    agent = {f"KVTB_SMARTNIC_{field.upper()}": value
             for field, value in placement.agent_settings(name, plan["smartnic"] if name == "nic" else ()).items()}
    return {**{f"KVTB_{service.upper()}_CPUS": text for service, text in placement.formatted(plan).items()}, **agent}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="deploy/placement.py", description=__doc__.splitlines()[0])
    parser.add_argument("placement", choices=placement.PLACEMENTS)
    parser.add_argument("--cpus", default="", help="the CPUs to place on (default: this process's)")
    args = parser.parse_args(argv)
    try:
        pairs = assignments(args.placement, args.cpus)
    except ValueError as exc:
        print(f"deploy/placement.py: {exc}", file=sys.stderr)
        return 2
    print(" ".join(f"{key}={value}" for key, value in pairs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
