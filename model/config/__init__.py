"""Configuration: pydantic schemas, validation with config-path errors, derived sizes."""

from servesim.config.derived import kv_bytes_per_token, num_gpu_blocks
from servesim.config.load import ConfigError, validate_config
from servesim.config.schema import RunConfig

__all__ = ["ConfigError", "RunConfig", "kv_bytes_per_token", "num_gpu_blocks", "validate_config"]
