"""Validated llm / hardware configs for unit tests that build models directly."""

from conftest import H100, LLAMA3_8B

from servesim.config.schema import HardwareConfig, LlmConfig

LLAMA8B_CFG = LlmConfig(**LLAMA3_8B)
H100_CFG = HardwareConfig(**H100)

# calibrated roofline factors for closed-form tests (round numbers, not the fitted ones)
CALIBRATED_FACTORS = {
    "e_c": 0.5,
    "e_m": 0.8,
    "e_a": 0.25,
    "o_p": 4.0,
    "o_d": 2.0,
    "o_seq": 0.01,
    "a_ar": 0.02,
    "o_req": 30.0,
}
