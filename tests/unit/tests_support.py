"""Validated llm / hardware configs for unit tests that build models directly."""

from conftest import H100, LLAMA3_8B

from model.config.schema import HardwareConfig, LlmConfig

LLAMA8B_CFG = LlmConfig(**LLAMA3_8B)
H100_CFG = HardwareConfig(**H100)
