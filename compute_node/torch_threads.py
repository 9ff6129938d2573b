"""How many threads torch runs the forward on, and where they run.

`thread_count`: torch_threads, or (0) one per CPU of the compute node's set. `bind_openmp`: set
the OpenMP environment so that libgomp (torch's OpenMP runtime) puts each of its threads on one
CPU of the set: a place per CPU, threads bound close to their master. libgomp reads it once, when
it is loaded (when torch is first imported), so it must run before that; libgomp then binds the
importing thread to the first place, which `kvtb.placement.apply` undoes once torch is imported
(every thread back on the whole set; a thread that starts a parallel region is bound to a place
of its own then, its team to the next ones: verified in tests/compute_node/test_torch_threads.py).
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, MutableMapping

logger = logging.getLogger(__name__)

# Variables a user may have set to bind OpenMP threads their own way: then they are left alone.
USER_BINDING = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def thread_count(torch_threads: int, cpus: Iterable[int]) -> int:
    """torch_threads when set (> 0), else one per CPU of the set."""
    if torch_threads < 0:
        raise ValueError(f"torch_threads must not be negative, got {torch_threads}")
    return torch_threads or max(1, len(tuple(cpus)))


def bind_openmp(cpus: Iterable[int], threads: int,
                environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set OMP_NUM_THREADS, OMP_PLACES (one place per CPU) and OMP_PROC_BIND=close in environ
    (default os.environ); the variables set. Nothing is bound where the user set a binding of
    their own. RuntimeError when torch is imported already (libgomp would not see them)."""
    environ = os.environ if environ is None else environ
    if environ is os.environ and "torch" in sys.modules:
        raise RuntimeError("bind_openmp: torch is imported already; its OpenMP runtime read the "
                           "environment when it was loaded")
    chosen = {"OMP_NUM_THREADS": str(threads)}
    if not any(environ.get(name) for name in USER_BINDING):
        chosen["OMP_PLACES"] = ",".join(f"{{{cpu}}}" for cpu in sorted(set(cpus)))
        chosen["OMP_PROC_BIND"] = "close"
    else:
        logger.info("OpenMP binding left as the environment sets it")
    environ.update(chosen)
    return chosen
