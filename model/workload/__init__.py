"""Workloads: trace readers, synthetic generators, request hashing and arrival drivers."""
