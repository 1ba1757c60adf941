"""Validated llm / hardware configs and round calibrated factors, for tests in any folder.

Imported as `tests_support`: pytest puts tests/ on sys.path for tests/conftest.py (no
`__init__.py` here), which is also where `from conftest import ...` finds it.
"""

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
    "o_d": 0.0625,  # ms per layer: 2 ms a decode step of Llama-3.1-8B's 32 layers
    "o_seq": 0.01,
    "a_ar": 0.02,
    "o_req": 30.0,
}
