"""Benchmarks (`kvtb bench ...`) and the helpers they share: common, stats, progress, output,
machine, rawlimits, barepath and cpu_use."""
