"""A cluster larger than one run can simulate is a config error that names the keys and the
limit (`MAX_ENGINE_RANKS` engine ranks: workers x dp_size, summed over the P/D pools), not an
out-of-memory traceback at the end of a long start (100,000 workers once ended in
`ArrowMemoryError`)."""

from __future__ import annotations

import re

import pytest
from conftest import make_config, run_servesim

from servesim.config import ConfigError


def test_the_limit_is_ten_thousand_ranks():
    from servesim.config.rules import MAX_ENGINE_RANKS

    assert MAX_ENGINE_RANKS == 10_000
    make_config(topology={"num_workers": 10_000})
    make_config(topology={"num_workers": 2_500}, engine={"dp_size": 4})
    make_config(
        topology={"kind": "disagg", "num_prefill_workers": 5_000, "num_decode_workers": 5_000}
    )


@pytest.mark.parametrize(
    ("sections", "named"),
    [
        (
            {"topology": {"num_workers": 10_001}},
            "topology.num_workers x engine.dp_size = 10001 x 1 = 10,001 engine ranks",
        ),
        (
            {"topology": {"num_workers": 2}, "engine": {"dp_size": 5_001}},
            "topology.num_workers x engine.dp_size = 2 x 5001 = 10,002 engine ranks",
        ),
        (
            {
                "topology": {
                    "kind": "disagg",
                    "num_prefill_workers": 6_000,
                    "num_decode_workers": 2_000,
                    "decode": {"dp_size": 4},
                }
            },
            "topology.num_prefill_workers x topology.prefill.dp_size + "
            "topology.num_decode_workers x topology.decode.dp_size = 6000 x 1 + 2000 x 4 = "
            "14,000 engine ranks",
        ),
    ],
)
def test_more_ranks_are_a_config_error_naming_the_keys(sections, named):
    with pytest.raises(ConfigError, match=re.escape(f"{named}; at most 10,000 can be simulated")):
        make_config(**sections)


def test_the_cli_exits_2_at_once(tmp_path):
    out = run_servesim(
        "topology.num_workers=100000", "hydra.run.dir=out", cwd=tmp_path, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert "topology.num_workers x engine.dp_size = 100000 x 1 = 100,000 engine ranks" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "out" / "summary.json").exists()
