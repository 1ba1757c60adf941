"""Agentic replay: agent lanes over plays of dependent requests, snapshots, warmup, profile."""
