"""Every shipped config composes and validates; bad overrides fail naming the config path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from servesim.cli import run
from servesim.config import ConfigError, validate_config
from servesim.config.derived import kv_bytes_per_token, num_gpu_blocks

CONF = Path(__file__).resolve().parents[2] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
GROUPS = {
    g: sorted(p.stem for p in (CONF / g).glob("*.yaml"))
    for g in (
        "llm",
        "hardware",
        "engine",
        "timing",
        "topology",
        "router",
        "workload",
        "load",
        "link",
    )
}


def composed(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


PROFILE = {
    "prefill_isl": [100, 1000],
    "prefill_ttft_ms": [10.0, 100.0],
    "decode_active_kv_tokens": [0, 1000],
    "decode_context_length": [0, 100],
    "decode_itl": [2.0, 4.0, 6.0, 8.0],
}


def validated(overrides: list[str], tmp_path: Path):
    """Compose and validate, filling the mandatory file paths (??? in conf/) with small files."""
    cfg = composed(overrides)
    extra = []
    if OmegaConf.is_missing(cfg.workload, "path"):
        trace = tmp_path / "t.jsonl"
        trace.write_text(
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        )
        extra.append(f"workload.path={trace}")
    if cfg.timing.kind == "interpolated" and OmegaConf.is_missing(cfg.timing, "path"):
        profile = tmp_path / "profile.json"
        profile.write_text(json.dumps(PROFILE))
        extra.append(f"timing.path={profile}")
    if extra:
        cfg = composed([*overrides, *extra])
    return validate_config(OmegaConf.to_container(cfg, resolve=True))


def differences_from_file(written: Any, validated_value: Any, where: str) -> list[str]:
    """Where `validated_value` differs from what an option file writes: every key the file sets
    (nested mappings key by key; `???`, the paths filled in by `validated`, skipped)."""
    if written == "???":
        return []
    if isinstance(written, dict):
        if not isinstance(validated_value, dict):
            return [f"{where}: {validated_value!r} is not a mapping"]
        return [
            diff
            for key, value in written.items()
            for diff in differences_from_file(value, validated_value.get(key), f"{where}.{key}")
        ]
    return [] if written == validated_value else [f"{where}: {written!r} != {validated_value!r}"]


def test_default_composes_and_validates(tmp_path):
    cfg = validated([], tmp_path)
    assert cfg.workload.kind == "synthetic" and cfg.topology.num_workers >= 1


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name, tmp_path):
    """Every value the experiment file writes reaches the validated config (applied last, it
    wins over the group options it picks)."""
    cfg = validated([f"experiment={name}"], tmp_path)
    written = OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / f"{name}.yaml"))
    written.pop("defaults", None)
    assert written, f"conf/experiment/{name}.yaml sets nothing"
    assert differences_from_file(written, cfg.model_dump(mode="json"), "config") == []


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_group_option_validates(group, option, tmp_path):
    """The validated config holds every value the option file writes (the file, not the
    schema's defaults, decides the group)."""
    cfg = validated([f"{group}={option}"], tmp_path)
    written = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
    assert written, f"conf/{group}/{option}.yaml sets nothing"
    assert differences_from_file(written, getattr(cfg, group).model_dump(mode="json"), group) == []


def test_dynamo_compat_sets_the_mocker_defaults(tmp_path):
    cfg = validated(["experiment=dynamo_compat"], tmp_path)
    e = cfg.engine
    assert (e.num_gpu_blocks, e.block_size, e.max_num_seqs, e.max_num_batched_tokens) == (
        16384,
        64,
        256,
        8192,
    )
    assert e.enable_prefix_caching and e.enable_chunked_prefill and e.preemption_mode == "lifo"
    assert cfg.timing.kind == "polynomial" and cfg.router.kind == "round_robin"


def test_llama_8b_kv_bytes_per_token(tmp_path):
    cfg = validated(["llm=llama3_8b"], tmp_path)
    assert kv_bytes_per_token(cfg.llm) == 131_072


def test_num_gpu_blocks_derived_from_hbm(tmp_path):
    """(80 GB x 0.9 - 16.06 GB weights - 2 GB reserve) / (64 x 131,072 B) = 6,430 blocks."""
    cfg = validated(["engine.num_gpu_blocks=null"], tmp_path)
    assert num_gpu_blocks(cfg) == 6430
    cfg = validated(["engine.num_gpu_blocks=null", "hardware=h200_sxm"], tmp_path)
    assert num_gpu_blocks(cfg) > 6430
    with pytest.raises(ValueError, match="engine.num_gpu_blocks"):
        num_gpu_blocks(validated(["engine.num_gpu_blocks=null", "llm=llama3_70b"], tmp_path))


@pytest.mark.parametrize(
    "override,path",
    [
        ("engine.block_size=1", "engine.block_size"),
        ("engine.max_num_seqs=0", "engine.max_num_seqs"),
        ("engine.preemption_mode=random", "engine.preemption_mode"),
        ("topology.num_workers=0", "topology.num_workers"),
        ("engine.gpu_memory_utilization=abc", "engine.gpu_memory_utilization"),
        ("load.arrival_speedup_ratio=-1", "load.arrival_speedup_ratio"),
        ("+engine.bogus=3", "engine.bogus"),
    ],
)
def test_bad_values_name_their_config_path(override, path, tmp_path):
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        validated([override], tmp_path)


def test_unknown_override_key_is_rejected_by_hydra():
    with pytest.raises(Exception, match="engine.bogus"):
        composed(["engine.bogus=3"])


def test_missing_trace_path_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="workload.path"):
        run(composed(["workload=mooncake"]), str(tmp_path))


def test_interpolated_profile_from_a_file_runs(tmp_path):
    """timing=interpolated_file reads the five arrays from timing.path."""
    from servesim import simulate

    cfg = validated(["timing=interpolated_file"], tmp_path)
    assert cfg.timing.path.endswith("profile.json")
    small = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"num_sessions": 5})})
    assert simulate(small).summary["completed_requests"] == 15


def test_a_misspelt_experiment_is_an_error():
    with pytest.raises(Exception, match="experiment/nope"):
        composed(["experiment=nope"])


@pytest.mark.parametrize(
    "override,path",
    [
        ("router.host_cache_hit_weight=-0.5", "router.host_cache_hit_weight"),
        ("router.decode_active_request_weight=-1", "router.decode_active_request_weight"),
        ("router.overlap_score_credit=1.5", "router.overlap_score_credit"),
        ("router.temperature=inf", "router.temperature"),
        ("router.temperature=nan", "router.temperature"),
        ("router.affinity.ttl_seconds=0.5", "router.affinity.ttl_seconds"),
        ("router.affinity.ttl_seconds=40000000", "router.affinity.ttl_seconds"),
        ("router.queue_policy=sjf", "router.queue_policy"),
    ],
)
def test_bad_kv_router_values_name_their_path(override, path, tmp_path):
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        validated(["router=kv", "topology.num_workers=2", override], tmp_path)


def test_kv_router_needs_more_than_one_routable_worker(tmp_path):
    with pytest.raises(ConfigError, match="more than one routable worker"):
        validated(["router=kv", "topology.num_workers=1"], tmp_path)
    # two attention-DP ranks of one worker are two targets
    validated(["router=kv", "topology.num_workers=1", "+engine.dp_size=2"], tmp_path)
    # a P/D pool of one prefill worker routes trivially
    validated(["router=kv", "topology=disagg"], tmp_path)


def test_sibling_group_affinity_needs_lineage(tmp_path):
    with pytest.raises(ConfigError, match="sibling_group requires conversation lineage"):
        validated(
            [
                "router=kv",
                "topology.num_workers=2",
                "router.affinity.mode=sibling_group",
                "workload=mooncake",
            ],
            tmp_path,
        )


def test_dynamo_compat_takes_the_kv_router(tmp_path):
    cfg = validated(["experiment=dynamo_compat", "router=kv", "topology.num_workers=2"], tmp_path)
    assert cfg.router.kind == "kv" and cfg.router.queue_threshold is None
    assert cfg.router.overlap_score_credit == 1.0 and cfg.router.temperature == 0.0
