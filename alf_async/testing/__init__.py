"""Tiny deterministic environments and policies shared by tests and benchmarks."""
