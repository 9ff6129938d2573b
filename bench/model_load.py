"""How long a compute node takes to load its model: the cache's tensors alone (compute_node/weights.py)
against transformers' own load, each in fresh processes, alternated, in one run.

    python -m bench.model_load [--reps 5] [--cache DIR] [--json]

Each sample is one new interpreter that imports torch and loads (model, tokenizer) from the cache, as
`kvtb serve compute` does: the wall time from exec to loaded, and the CPU seconds it used. The ratio
is transformers' median over ours.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench.results import emit_json, machine_info

CHILD = """
import json, os, sys, time
t0 = float(sys.argv[1])
from compute_node import model_loader
model, tokenizer = model_loader.load_model(sys.argv[3], reference=sys.argv[2] == "transformers")
t = os.times()
print(json.dumps({"wall_s": time.time() - t0, "cpu_s": t.user + t.system, "class": type(model).__name__}))
"""
PATHS = ("tensors", "transformers")


def sample(path: str, cache: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, repr(time.time()), path, cache], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    if done.returncode != 0:
        raise RuntimeError(f"the {path} load failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from compute_node.settings import ComputeSettings
    parser = argparse.ArgumentParser(prog="python -m bench.model_load", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="fresh processes per path (default 5)")
    parser.add_argument("--cache", default=os.path.expanduser(ComputeSettings().model_cache_dir),
                        help="the model cache (default: the compute node's)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    samples: dict[str, list[dict]] = {p: [] for p in PATHS}
    for i in range(args.reps):
        for path in (PATHS if i % 2 == 0 else PATHS[::-1]):  # alternated: neither always goes first
            samples[path].append(sample(path, args.cache))
    median = {p: {k: statistics.median(s[k] for s in samples[p]) for k in ("wall_s", "cpu_s")} for p in PATHS}
    result = {"bench": "model_load", "machine": machine_info(), "settings": vars(args), "samples": samples,
              "median": median,
              "ratios": {f"load_{k.split('_')[0]}_transformers_vs_tensors":
                         median["transformers"][k] / median["tensors"][k] for k in ("wall_s", "cpu_s")}}
    if args.json:
        emit_json(result)
    else:
        for p in PATHS:
            print(f"{p:>12}: {median[p]['wall_s']:.2f} s wall, {median[p]['cpu_s']:.2f} s CPU "
                  f"(median of {args.reps}; model class {samples[p][0]['class']})")
        print("transformers / tensors: " + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
