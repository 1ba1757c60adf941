"""servesim: a SimPy model of LLM inference serving.

from model import simulate, RunConfig
result = simulate(RunConfig.model_validate(config_dict))
result.summary, result.requests, result.passes, result.kv
"""

from model.config import ConfigError, RunConfig, validate_config
from model.sim import Result, simulate

__all__ = ["ConfigError", "Result", "RunConfig", "simulate", "validate_config"]
