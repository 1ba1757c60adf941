"""Engines: scheduler policies (what runs in the next pass) and the Worker pass-loop process."""
