"""How a measured benchmark row becomes a servesim run: a silicon CSV row (AISimulate's
`silicon_sample.csv` format) mapped to a Point, or to the reason it is skipped, and the Point
to the Hydra overrides of the run that reproduces its deployment and load.

A row whose model, system and parallelism servesim models becomes a RunConfig composed from
conf/ with Hydra's compose API (as experiments/compare_dynamo.py does); experiments/accuracy.py
runs it and compares:

* llm: the row's `model_path` through MODELS (a Hugging Face id -> conf/llm option),
  `llm.dtype` from `precision` (fp8, fp4; bf16 or empty: bfloat16), `llm.kv_dtype` bfloat16
  (vLLM's default), fp8 on B200 (KV_DTYPES says why);
* hardware: the row's `system` through SYSTEMS; `engine.tp_size` = `tp_size` (a MoE row's
  expert parallelism, `moe_ep_size`, spreads the experts over the same GPUs: priced as TP);
* engine: the row's `backend` through ENGINES (vLLM, SGLang and TRT-LLM each its scheduler);
* attention data parallelism: `attention_dp_size` > 1 runs `engine.dp_size` ranks of `tp_size`
  GPUs each, the experts spread over all of them (servesim.config.derived), and `batch_size`
  is per rank (the source's `silicon_concurrency` is batch_size x attention_dp_size);
* disaggregated rows (`mode` disagg): `topology=disagg` with the row's prefill and decode
  workers, each role's TP and attention DP, and per (prefill, decode) pair an InfiniBand link
  of 50 GB/s per GPU of the smaller worker; the clients are the source's
  `silicon_concurrency`, else `decode_batch_size` x decode ranks. A row that lacks its worker
  counts runs the deployment published for it where one fits (experiments/
  published_deployments.py: workers, attention DP and MTP drafts of the InferenceX
  configuration), else counts sized by rate matching (experiments/rate_match.py);
  either is said in the result's note;
* the measured load: a closed loop at `batch_size` (x DP ranks; disagg: the clients) requests
  in flight (`load=concurrency`), 10 x that many single-turn synthetic requests whose input
  and output lengths are drawn uniformly from 80-100 % of `isl` / `osl` (SGLang rows: exactly
  `isl` / `osl`, LENGTH_LOW_BY_BACKEND says why), no shared prefix, prefix caching off,
  `max_num_batched_tokens` 8192, `max_num_seqs` max(256, batch_size), the KV pool derived
  from HBM, one aggregated worker behind round robin, a fixed seed;
* timing: accuracy.py's `--timing` (any conf/timing option), then every `--override`.

Rows it does not run are counted by reason (the first that applies): mode (agg and disagg),
backends, models, systems, precisions, `pp_size` > 1, an incomplete row. A run that fails
(e.g. the weights leave no room for KV at that TP: ConfigError) is recorded with its
message and left out of the MAPE.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import pandas as pd
from published_deployments import Deployment, published  # (experiments/ is on the path)
from rate_match import rate_matched_workers

from servesim import RunConfig, compose

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"

# Hugging Face id -> conf/llm option (the Instruct, NVFP4 and FP8 checkpoints have the base
# model's geometry; DeepSeek-R1 and V3.1 DeepSeek-V3's)
MODELS: dict[str, str] = {
    "meta-llama/Llama-3.1-70B": "llama3_70b",
    "meta-llama/Llama-3.1-8B": "llama3_8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama3_8b",
    "Qwen/Qwen3-32B": "qwen3_32b",
    "nvidia/Qwen3-32B-NVFP4": "qwen3_32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3_235b_a22b",
    "Qwen/Qwen3.5-397B-A17B": "qwen3_5_397b_a17b",
    "deepseek-ai/DeepSeek-R1": "deepseek_v3",
    "deepseek-ai/DeepSeek-V3": "deepseek_v3",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek_v3",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek_v3",
    "moonshotai/Kimi-K2.5": "kimi_k2_5",
    "zhipuai/GLM-5": "glm5",
    "MiniMaxAI/MiniMax-M2.5": "minimax_m2_5",
    "openai/gpt-oss-120b": "gpt_oss_120b",
}
# silicon `backend` -> conf/engine option: each backend's rows run its own scheduler
ENGINES: dict[str, str] = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}
# silicon `system` -> conf/hardware option
SYSTEMS: dict[str, str] = {"h100_sxm": "h100_sxm", "h200_sxm": "h200_sxm", "b200_sxm": "b200"}
# silicon `precision` (weights) -> llm.dtype; "" is an empty cell (unquantized checkpoints)
PRECISIONS: dict[str, str] = {
    "fp8": "fp8",
    "fp4": "fp4",
    "int4": "int4",
    "bf16": "bfloat16",
    "": "bfloat16",
}
# KV dtype per system: vLLM's default keeps KV in bfloat16, which reproduces the H100 points
# (the 70B tp2 points whose TTFT jumps to 30-59 s queue for bf16 KV in servesim too). The B200
# points cannot have: at tp1, batch 64, 1024x8192 their KV in bf16 is 64 x 9,216 x 327,680 B =
# 193 GB, more than the GPU's 180 GB, yet they show no KV queueing (TTFT 0.24-0.38 s); in fp8 it
# fits (their FP8/NVFP4 checkpoints carry FP8 KV scales). So B200 points run with fp8 KV.
KV_DTYPES: dict[str, str] = {"b200_sxm": "fp8"}
KV_DTYPE = "bfloat16"  # every other system


def kv_dtype_for(system: str) -> str:
    return KV_DTYPES.get(system, KV_DTYPE)


INFINIBAND_GBPS_PER_GPU = 50.0  # one 400 Gb/s NIC per GPU (conf/link/infiniband.yaml)
MAX_NUM_BATCHED_TOKENS = 8192
MIN_MAX_NUM_SEQS = 256
REQUESTS_PER_CLIENT = 10  # about 10 x concurrency requests per measured point
LENGTH_LOW = 0.8  # request lengths drawn uniformly from 80-100 % of nominal
# ... except where the measurements show lock-step waves: every SGLang row's mean TTFT is the
# prefill of the whole wave and does not depend on the output length (Qwen3-32B, H100, TP 2,
# 1,024 input tokens, 16 clients: 841 / 806 / 844 ms at 128 / 256 / 512 output tokens;
# Qwen3.5-397B, B200, TP 4, 64 clients: 1,114 / 1,044 ms at 1,024 / 8,192), which requests of
# varied lengths cannot give; identical lengths (every request's, LENGTH_LOW 1) reproduce it
# (docs/accuracy.md, "SGLang's rows move in waves")
LENGTH_LOW_BY_BACKEND: dict[str, float] = {"sglang": 1.0}


def length_low(backend: str) -> float:
    """The shortest request length of a row's load, as a fraction of nominal."""
    return LENGTH_LOW_BY_BACKEND.get(backend, LENGTH_LOW)


REQUIRED_COLUMNS = (
    "id",
    "backend",
    "model_path",
    "system",
    "precision",
    "mode",
    "isl",
    "osl",
    "batch_size",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
)
# skip reasons, in the order they are checked (a row counts under the first that applies)
SKIP_REASONS = (
    "mode",
    "backend",
    "model",
    "system",
    "precision",
    "pp_size > 1",
    "incomplete row",
)


class BadInput(ValueError):
    """An unreadable silicon CSV, a missing column, or arguments that select nothing."""


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Pool:
    """One role of a disaggregated row: its workers (None: not in the row), each `tp` x `dp`
    GPUs."""

    workers: int | None
    tp: int
    dp: int


@dataclass(frozen=True)
class Point:
    """One measured benchmark point that servesim can reproduce (`prefill` and `decode` set
    for a disaggregated row; `tp`, `dp` and `batch_size` are then the decode role's)."""

    id: str
    system: str
    backend: str
    engine: str
    model: str
    llm: str
    hardware: str
    precision: str
    dtype: str
    tp: int
    dp: int  # attention data-parallel ranks
    batch_size: int  # requests in flight per attention-DP rank
    isl: int
    osl: int
    measured_ttft_ms: float
    measured_tpot_ms: float
    concurrency: int  # requests in flight (the closed loop's clients)
    prefill: Pool | None = None
    decode: Pool | None = None
    assumption: str = ""  # what the row does not say and the run assumes (in the result's note)
    decode_drafts: int | None = None  # speculative tokens per decode step (a published MTP run)


@dataclass(frozen=True)
class Skip:
    """A selected row servesim does not run: `reason` is one of SKIP_REASONS."""

    id: str
    reason: str
    detail: str


def read_silicon(path: str | Path) -> pd.DataFrame:
    """The silicon CSV, checked for the columns the harness reads."""
    try:
        df = pd.read_csv(path, dtype={"precision": str, "id": str}, keep_default_na=True)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise BadInput(f"--silicon {path}: cannot read it as CSV ({e})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise BadInput(
            f"--silicon {path}: missing column(s) {', '.join(missing)}; a silicon CSV needs "
            f"{', '.join(REQUIRED_COLUMNS)}"
        )
    return df


def select(df: pd.DataFrame, backend: str | None, mode: str | None) -> pd.DataFrame:
    """The rows whose backend and mode match (None: any)."""
    keep = pd.Series(True, index=df.index)
    if backend is not None:
        keep &= df["backend"] == backend
    if mode is not None:
        keep &= df["mode"] == mode
    return df[keep]


def _text(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).strip()


def _number(v: Any) -> float | None:
    """A finite number, or None for an empty or non-numeric cell."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _size(v: Any) -> int:
    """A parallelism degree; an empty cell (or 0, "not set" in some sources) is 1."""
    x = _number(v)
    return 1 if x is None or x == 0 else int(x)


def map_row(row: Mapping[str, Any]) -> Point | Skip:
    """What servesim runs for one silicon row, or why it does not."""
    rid = _text(row["id"])
    mode = _text(row["mode"])
    model = _text(row["model_path"])
    system = _text(row["system"])
    precision = _text(row["precision"])
    if mode not in ("agg", "disagg"):
        return Skip(rid, "mode", f"mode {mode or '(empty)'}: only agg and disagg are reproduced")
    backend = _text(row["backend"])
    if backend not in ENGINES:
        return Skip(rid, "backend", f"unsupported backend {backend or '(empty)'}")
    if model not in MODELS:
        return Skip(rid, "model", f"unsupported model {model or '(empty)'}")
    if system not in SYSTEMS:
        return Skip(rid, "system", f"unsupported system {system or '(empty)'}")
    if precision not in PRECISIONS:
        return Skip(rid, "precision", f"unsupported precision {precision}")
    pp = max(_size(row.get(f"{r}pp_size")) for r in ("", "prefill_", "decode_"))
    if pp > 1:
        return Skip(rid, "pp_size > 1", f"pp_size {pp}: pipeline parallelism is not modelled")
    needed = ("isl", "osl", "batch_size", "tp_size") if mode == "agg" else ("isl", "osl")
    values = {k: _number(row[k]) for k in needed}
    values["silicon_ttft_ms"] = _number(row["silicon_ttft_ms"])
    values["silicon_tpot_ms"] = _number(row["silicon_tpot_ms"])
    pools = None
    if mode == "disagg":
        pools = _pools(row)
        values["concurrency"] = _disagg_concurrency(row, pools[1])
    bad = [k for k, v in values.items() if v is None or v <= 0]
    if bad:
        return Skip(rid, "incomplete row", f"no positive {', '.join(bad)}")
    prefill: Pool | None = None
    decode: Pool | None = None
    deployment = published().get(rid) if pools is not None else None
    if deployment is not None:
        pools = _published_pools(deployment)
    if pools is not None:
        prefill, decode = pools
        concurrency = int(cast(float, values["concurrency"]))
        # (until rate matching sizes a decode pool the row lacks: as if one worker)
        ranks = (decode.workers or 1) * decode.dp
        tp, dp, batch = decode.tp, decode.dp, math.ceil(concurrency / ranks)
    else:
        tp, dp = int(cast(float, values["tp_size"])), _size(row["attention_dp_size"])
        batch = int(cast(float, values["batch_size"]))
        concurrency = batch * dp
    return Point(
        id=rid,
        system=system,
        backend=backend,
        engine=ENGINES[backend],
        model=model,
        llm=MODELS[model],
        hardware=SYSTEMS[system],
        precision=precision or "bf16",
        dtype=PRECISIONS[precision],
        tp=tp,
        dp=dp,
        batch_size=batch,
        isl=int(cast(float, values["isl"])),
        osl=int(cast(float, values["osl"])),
        measured_ttft_ms=cast(float, values["silicon_ttft_ms"]),
        measured_tpot_ms=cast(float, values["silicon_tpot_ms"]),
        concurrency=concurrency,
        prefill=prefill,
        decode=decode,
        assumption="" if deployment is None else f"not in the row, published: {deployment.source}",
        decode_drafts=None if deployment is None else deployment.drafts,
    )


def _published_pools(d: Deployment) -> tuple[Pool, Pool]:
    return (
        Pool(workers=d.prefill.workers, tp=d.prefill.tp, dp=d.prefill.dp),
        Pool(workers=d.decode.workers, tp=d.decode.tp, dp=d.decode.dp),
    )


def _pools(row: Mapping[str, Any]) -> tuple[Pool, Pool]:
    """A disaggregated row's prefill and decode roles (an empty worker count is None)."""

    def pool(role: str) -> Pool:
        workers = _number(row.get(f"{role}_num_workers"))
        return Pool(
            workers=None if workers is None else max(1, int(workers)),
            tp=_size(row.get(f"{role}_tp_size")),
            dp=_size(row.get(f"{role}_attention_dp_size")),
        )

    return pool("prefill"), pool("decode")


def _disagg_concurrency(row: Mapping[str, Any], decode: Pool) -> float | None:
    """Clients of a disaggregated row: the source's `silicon_concurrency=N`, else its decode
    batch per rank times the decode ranks; None when neither is given."""
    m = re.search(r"silicon_concurrency=(\d+)", _text(row.get("silicon_data_source")))
    if m:
        return float(m.group(1))
    batch = _number(row.get("decode_batch_size"))
    if batch is None or decode.workers is None:
        return None
    return batch * decode.workers * decode.dp


def size_pools(point: Point, timing: str = "roofline", overrides: Sequence[str] = ()) -> Point:
    """A disaggregated point whose row lacks a worker count, with that count sized by rate
    matching (servesim's own timing and KV pools for the row's roles: rate_match.py) and said
    in its note; any other point as it is."""
    p, d = point.prefill, point.decode
    if p is None or d is None or (p.workers is not None and d.workers is not None):
        return point
    one = replace(point, prefill=replace(p, workers=1), decode=replace(d, workers=1))
    cfg = compose_point_config(one, timing, overrides)
    n_prefill, n_decode = rate_matched_workers(cfg, point.concurrency, point.isl, point.osl)
    prefill = replace(p, workers=p.workers or n_prefill)
    decode = replace(d, workers=d.workers or n_decode)
    sized = [
        f"{role}_num_workers {n}"
        for role, n, given in (("prefill", n_prefill, p), ("decode", n_decode, d))
        if given.workers is None
    ]
    return replace(
        point,
        prefill=prefill,
        decode=decode,
        batch_size=math.ceil(point.concurrency / (cast(int, decode.workers) * decode.dp)),
        assumption=f"not in the row, rate-matched: {', '.join(sized)}",
    )


def plan(df: pd.DataFrame) -> tuple[list[Point], list[Skip]]:
    """Every row mapped; both lists sorted by id."""
    points: list[Point] = []
    skips: list[Skip] = []
    for row in df.to_dict("records"):
        item = map_row(row)
        if isinstance(item, Point):
            points.append(item)
        else:
            skips.append(item)
    return sorted(points, key=lambda p: p.id), sorted(skips, key=lambda s: s.id)


# --------------------------------------------------------------------------- overrides


def _lengths(key: str, nominal: int, low: float) -> list[str]:
    """Uniform over [round(low x nominal), nominal] (mean (1 + low) / 2 x nominal), each key
    set so no value of the option file's lognormal survives."""
    return [
        f"{key}.dist=uniform",
        f"{key}.mean={(1 + low) / 2 * nominal:g}",
        f"{key}.std=0",
        f"{key}.min={max(1, round(low * nominal))}",
        f"{key}.max={nominal}",
    ]


def point_overrides(point: Point, timing: str = "roofline", seed: int = 0) -> list[str]:
    """The Hydra overrides that reproduce one measured point's setup and load."""
    return [
        f"llm={point.llm}",
        f"llm.dtype={point.dtype}",
        f"llm.kv_dtype={kv_dtype_for(point.system)}",
        f"hardware={point.hardware}",
        f"engine={point.engine}",
        f"timing={timing}",
        *_topology(point),
        "router=round_robin",
        "load=concurrency",
        f"load.concurrency={point.concurrency}",
        "workload=synthetic",
        f"workload.num_sessions={REQUESTS_PER_CLIENT * point.concurrency}",
        "workload.turns_per_session=1",
        *_lengths("workload.input_tokens", point.isl, length_low(point.backend)),
        *_lengths("workload.output_tokens", point.osl, length_low(point.backend)),
        "workload.shared_prefix_ratio=0",
        "workload.num_prefix_groups=0",
        f"engine.tp_size={point.tp}",
        f"++engine.dp_size={point.dp}",
        "engine.enable_prefix_caching=false",
        f"engine.max_num_batched_tokens={MAX_NUM_BATCHED_TOKENS}",
        f"engine.max_num_seqs={max(MIN_MAX_NUM_SEQS, point.batch_size)}",
        "engine.num_gpu_blocks=null",
        "output.tables=false",
        "output.progress=off",
        f"seed={seed}",
    ]


def _topology(point: Point) -> list[str]:
    """One aggregated worker, or the row's P/D pools joined by InfiniBand (a 400 Gb/s NIC per
    GPU: a link moves KV at 50 GB/s per GPU of the smaller worker)."""
    if point.prefill is None or point.decode is None:
        return ["topology=aggregated", "topology.num_workers=1"]
    p, d = point.prefill, point.decode
    if p.workers is None or d.workers is None:
        raise ValueError(f"{point.id}: a worker count the row lacks is not sized (size_pools)")
    nics = min(p.tp * p.dp, d.tp * d.dp)
    return [
        "topology=disagg",
        f"topology.num_prefill_workers={p.workers}",
        f"topology.num_decode_workers={d.workers}",
        f"topology.prefill.tp_size={p.tp}",
        f"topology.prefill.dp_size={p.dp}",
        f"topology.decode.tp_size={d.tp}",
        f"topology.decode.dp_size={d.dp}",
        "link=infiniband",
        f"link.bandwidth_gbps={INFINIBAND_GBPS_PER_GPU * nics:g}",
        *(
            []
            if point.decode_drafts is None
            else [f"++topology.decode.speculative.num_speculative_tokens={point.decode_drafts}"]
        ),
    ]


def compose_point_config(
    point: Point, timing: str = "roofline", overrides: Sequence[str] = (), seed: int = 0
) -> RunConfig:
    """servesim's RunConfig for one point, composed from conf/ as the `servesim` CLI would
    (the user's overrides last, so they win)."""
    return compose([*point_overrides(point, timing, seed), *overrides])
