"""The error a workload source raises: it names the file and line (or the config path)."""


class TraceError(ValueError):
    """A trace file or workload setting that cannot be replayed as written."""
