"""Workloads and timing shared by the benchmark scripts and `hotrod demo`."""
