"""The error bad configuration raises: it names the config path and what was expected."""


class ConfigError(ValueError):
    """A config value is missing, unknown, of the wrong type, out of range, or inconsistent."""
