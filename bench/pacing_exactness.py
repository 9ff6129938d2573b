"""How exactly dilated time reproduces a modeled time: a plain decode step and a plain 64 MiB host copy,
each run alone under a profile at D, their virtual time (wall / D) beside the model's.

`kvtb profile check NAME --pacing` runs it after the calibration, at the D it recommends (or the
--dilation given). The issue's target: within 5% of the modeled virtual time, and no violation.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from scale import ops
from scale import profile as pf
from scale.dilation import Pacer

TOLERANCE = 0.05
COPY_BYTES = 64 * 1024 * 1024
DECODE = [(512, 1)]  # batch 1, context 512


def virtual_times(pacer: Pacer, kind: str, modeled_s: float, work: Callable[[], None], repeats: int) -> list[float]:
    """Run `work` paced as `kind` `repeats` times; each run's wall time / D."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        with pacer.op(kind, modeled_s):
            work()
        out.append(pacer.virtual(time.perf_counter() - start))
    return out


def summary(modeled_s: float, virtual: list[float], violations: int) -> dict:
    med = statistics.median(virtual)
    return {"modeled_s": modeled_s, "virtual_median_s": med, "virtual_max_s": max(virtual),
            "ratio": med / modeled_s, "within": abs(med / modeled_s - 1) <= TOLERANCE and violations == 0,
            "runs": len(virtual), "violations": violations}


def exactness(p: pf.Profile, dilation: float, repeats: int = 5, step: Callable[[], None] | None = None) -> dict:
    """{kind: summary}: `host copy` always; `decode step` when the profile costs a step and `step` (one
    real decode step) is given."""
    out = {}
    src = np.ones(COPY_BYTES, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # its pages faulted in: the copy, not the first touch, is what is paced
    pacer = Pacer(dilation, profile=p.name)
    copy_s = ops.modeled_s(p, "swap_out", COPY_BYTES)  # a plain copy over the gpu_to_host link, bytes as given
    virtual = virtual_times(pacer, "swap_out", copy_s, lambda: np.copyto(dst, src), repeats)
    out["host copy 64 MiB"] = summary(copy_s, virtual, pacer.snapshot()["kinds"]["swap_out"]["violations"])
    if step is not None and ops.applies(p, "gpu_step"):
        step()  # warm
        step_s = ops.modeled_s(p, "gpu_step", batch=DECODE)
        virtual = virtual_times(pacer, "gpu_step", step_s, step, repeats)
        out["decode step, batch 1, context 512"] = summary(step_s, virtual,
                                                          pacer.snapshot()["kinds"]["gpu_step"]["violations"])
    return out


def lines(result: dict, dilation: float) -> list[str]:
    rows = [f"pacing at D {dilation:.3g} (virtual = wall / D; target within {TOLERANCE:.0%}, no violation):"]
    for name, r in result.items():
        rows.append(f"  {name}: modeled {r['modeled_s'] * 1e3:.4g} ms, virtual median {r['virtual_median_s'] * 1e3:.4g} ms "
                    f"(x{r['ratio']:.4f}), {r['violations']} violations of {r['runs']}: "
                    f"{'within' if r['within'] else 'NOT within'}")
    return rows
