"""servesim: a SimPy model of LLM inference serving.

from model import simulate, RunConfig
result = simulate(RunConfig.model_validate(config_dict))
result.summary, result.requests, result.passes, result.kv
"""

from model import native

native.activate()  # the compiled build of these sources, if one was made (model/native.py)

from model.config import ConfigError, RunConfig, validate_config  # noqa: E402
from model.sim import Result, simulate  # noqa: E402

__all__ = ["ConfigError", "Result", "RunConfig", "simulate", "validate_config"]
