"""kvtestbed: shared plumbing (settings, service launch, gRPC health) and the `kvtb` CLI."""
