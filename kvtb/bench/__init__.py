"""Benchmarks (`kvtb bench ...`) and the helpers they share: stats, progress, output, machine, rawlimits."""
