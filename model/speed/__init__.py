"""The speed layer: what makes a replay fast without changing a single answer.

Decode stretches (servesim.speed.stretch) apply runs of decode-only passes at once; the rest
is described in docs/speed.md. Each piece has an equivalence test that compares its tables
with the textbook loop's.
"""
