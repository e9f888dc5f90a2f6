"""Benchmarks of the workloads in docs/workloads.md (see benchmarks/README.md)."""
