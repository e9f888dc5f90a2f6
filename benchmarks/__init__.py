"""Benchmarks of the workloads in WORKLOADS.md (see benchmarks/README.md)."""
