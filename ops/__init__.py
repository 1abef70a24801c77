"""Operational tooling that ships with the repository: benchmarks, and later deployment files."""
