"""Model geometry as the engines keep it: KV bytes per token for grouped-query and latent (MLA)
attention, sliding-window and linear-attention layers, KV per GPU of a TP group, attention
flops; each against numbers worked out by hand."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from servesim.config.derived import (
    attn_flops_per_pair,
    full_attention_layers,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_bytes_read_per_token,
    linear_state_bytes,
    window_attention_flops,
    window_kv_bytes,
)
from servesim.config.schema import LlmConfig

GQA = dict(
    name="gqa",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    num_params_b=8.0,
)
# DeepSeek-V3's attention: 61 layers, 128 heads, a 512-wide latent and a 64-wide rotary key
MLA = dict(
    name="mla",
    num_layers=61,
    hidden_size=7168,
    num_attention_heads=128,
    num_kv_heads=128,
    head_dim=192,
    vocab_size=129280,
    num_params_b=671.0,
    attention="mla",
    kv_lora_rank=512,
    qk_rope_head_dim=64,
)


def llm(base: dict, **changes) -> LlmConfig:
    return LlmConfig(**{**base, **changes})


def test_grouped_query_kv_is_k_and_v_of_every_kv_head_in_every_layer():
    m = llm(GQA)
    assert kv_bytes_per_token(m) == 32 * 2 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token_per_gpu(m, 4) == 131072 // 4


def test_a_tp_group_larger_than_the_kv_heads_holds_copies():
    """8 KV heads over 16 GPUs: each GPU still holds one whole head (a head is never split)."""
    m = llm(GQA)
    assert kv_bytes_per_token_per_gpu(m, 8) == 32 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token_per_gpu(m, 16) == kv_bytes_per_token_per_gpu(m, 8)


def test_mla_keeps_one_latent_and_rotary_key_per_layer_on_every_gpu():
    m = llm(MLA)
    assert kv_bytes_per_token(m) == 61 * (512 + 64) * 2 == 70272
    assert kv_bytes_per_token_per_gpu(m, 8) == 70272, "the latent is not split over TP"
    assert kv_bytes_per_token(llm(MLA, kv_dtype="fp8")) == 61 * 576


def test_sliding_window_and_linear_layers_take_no_per_token_kv():
    """gpt-oss-like: 36 layers, half of them with a 128-token window; a hybrid with 3 of 4
    layers linear attention keeps per-token KV in the other quarter only."""
    window = llm(GQA, num_layers=36, sliding_window=128, num_sliding_window_layers=18)
    per_layer = 2 * 8 * 128 * 2
    assert full_attention_layers(window) == 18
    assert kv_bytes_per_token(window) == 18 * per_layer
    assert window_kv_bytes(window, 100) == 18 * per_layer * 100
    assert window_kv_bytes(window, 5000) == 18 * per_layer * 128
    hybrid = llm(GQA, num_layers=48, num_linear_attention_layers=36)
    assert kv_bytes_per_token(hybrid) == 12 * per_layer
    assert window_kv_bytes(hybrid, 5000) == 0


def test_attention_flops_per_pair():
    assert attn_flops_per_pair(llm(GQA)) == 4 * 32 * 32 * 128
    m = llm(MLA)
    assert attn_flops_per_pair(m) == 4 * 61 * 128 * 192, "prefill: full heads"
    assert attn_flops_per_pair(m, decode=True) == 2 * 61 * 128 * (2 * 512 + 64), "absorbed"
    window = llm(GQA, num_layers=36, sliding_window=128, num_sliding_window_layers=18)
    assert attn_flops_per_pair(window) == 4 * 18 * 32 * 128
    assert window_attention_flops(window, 10, 1000, False) == 4 * 32 * 128 * 18 * 10 * 128


@pytest.mark.parametrize(
    "changes, needle",
    [
        (dict(attention="mla"), "mla needs kv_lora_rank"),
        (dict(kv_lora_rank=512), "for attention: mla only"),
        (dict(sliding_window=128), "go together"),
        (dict(num_sliding_window_layers=4), "go together"),
        (dict(num_linear_attention_layers=32), "at least one full-attention layer"),
    ],
)
def test_incomplete_attention_geometry_is_refused(changes, needle):
    with pytest.raises(ValidationError, match=needle):
        llm(GQA, **changes)


@pytest.mark.parametrize(
    "option, kv_bytes",
    [
        ("deepseek_v3", 61 * (512 + 64) * 2),
        ("kimi_k2_5", 61 * (512 + 64) * 2),
        ("glm5", 78 * (512 + 64) * 2),
        ("minimax_m2_5", 62 * 2 * 8 * 128 * 2),
        ("qwen3_5_397b_a17b", 15 * 2 * 2 * 256 * 2),
        ("gpt_oss_120b", 18 * 2 * 8 * 64 * 2),
    ],
)
def test_shipped_models_keep_the_kv_their_engines_keep(option, kv_bytes):
    """In bfloat16, what vLLM and SGLang cache per token (docs/config.md's table)."""
    from servesim import compose

    assert kv_bytes_per_token(compose([f"llm={option}"]).llm) == kv_bytes


def test_an_mla_pool_is_sized_with_the_latent_on_every_gpu():
    """DeepSeek-V3 (fp8 weights, bf16 KV) on 8 H200s: each GPU holds its share of the
    weights and the whole latent of every cached token."""
    from servesim import compose
    from servesim.config.derived import num_gpu_blocks

    cfg = compose(
        ["llm=deepseek_v3", "hardware=h200_sxm", "engine.tp_size=8", "engine.num_gpu_blocks=null"]
    )
    e = cfg.engine
    per_gpu = cfg.hardware.hbm_gb * 1e9 * e.gpu_memory_utilization - e.activation_reserve_gb * 1e9
    free = 8 * per_gpu - 671e9
    per_token_all_gpus = 8 * 61 * 576 * 2
    assert num_gpu_blocks(cfg) == int(free // (e.block_size * per_token_all_gpus))


def test_trtllm_gives_kv_a_fraction_of_the_memory_the_weights_leave():
    """vLLM's gpu_memory_utilization is a fraction of all HBM, weights inside it; TensorRT-LLM's
    free_gpu_memory_fraction a fraction of what the weights and activations leave."""
    from servesim import compose
    from servesim.config.derived import num_gpu_blocks

    base = ["llm=llama3_70b", "engine.tp_size=4", "engine.num_gpu_blocks=null"]
    vllm = compose(base)
    trtllm = compose([*base, "engine=trtllm", "engine.block_size=64"])
    assert trtllm.engine.memory_fraction_of == "free"
    hbm, weights, reserve = 4 * 80e9, 70.55e9 * 2, 4 * 2e9
    block = 64 * 327680
    assert num_gpu_blocks(vllm) == int((0.9 * hbm - weights - reserve) // block)
    assert num_gpu_blocks(trtllm) == int(0.9 * (hbm - weights - reserve) // block)


def test_attention_dp_ranks_share_the_experts_and_each_keeps_the_dense_part():
    """DeepSeek-V3 (fp8) on 8 B200s as 8 attention-DP ranks of 1 GPU: a rank holds the dense
    part (671 - 256 e B, e = (671 - 37) / 248 B per expert) and 1/8 of the experts; its pool is
    what one GPU has left after them. One rank (dp 1) would hold all 671 GB: no room."""
    from servesim import compose
    from servesim.config.derived import (
        all_to_all_bytes_per_token,
        num_gpu_blocks,
        rank_weight_bytes,
        weight_bytes_read,
    )
    from servesim.config.errors import ConfigError

    base = ["llm=deepseek_v3", "hardware=b200", "engine.tp_size=1", "engine.num_gpu_blocks=null"]
    cfg = compose([*base, "+engine.dp_size=8"])
    expert = (671 - 37) / 248
    dense = 671 - 256 * expert
    rank = (dense + 256 * expert / 8) * 1e9
    assert rank_weight_bytes(cfg.llm, 8) == pytest.approx(rank)
    assert rank_weight_bytes(cfg.llm, 1) == pytest.approx(671e9)
    e = cfg.engine
    kv = 180e9 * e.gpu_memory_utilization - rank_weight_bytes(cfg.llm, 8) - 2e9
    assert num_gpu_blocks(cfg) == int(kv // (e.block_size * 61 * 576 * 2))
    with pytest.raises(ConfigError, match="weights per rank"):
        num_gpu_blocks(compose(base))
    # experts see the tokens of all 8 ranks: one token per rank touches 1 - (1 - 8/256)^8 of
    # them, and the rank reads its eighth
    touched = 256 * (1 - (1 - 8 / 256) ** 8)
    assert weight_bytes_read(cfg.llm, 1, 8) == pytest.approx((dense + touched * expert / 8) * 1e9)
    assert weight_bytes_read(cfg.llm, 1e6, 8) == pytest.approx(rank)
    # dispatch and combine of a token to its 8 experts, per layer, 7/8 of it off the GPU
    assert all_to_all_bytes_per_token(cfg.llm, 1, 8) == 61 * 2 * 8 * 7168 * 2 * 7 / 8
    assert all_to_all_bytes_per_token(cfg.llm, 8, 1) == 0  # experts under TP: the all-reduce
    assert all_to_all_bytes_per_token(compose(["llm=llama3_8b"]).llm, 1, 8) == 0  # dense


def test_a_tp_group_reads_kv_every_gpu_holds_once_per_gpu():
    """8 KV heads split over 4 GPUs: the group reads each token's KV once; over 16 GPUs each
    head sits on 2 of them, so it is read twice; MLA's latent, on every GPU, 8 times at TP 8."""
    gqa, mla = LlmConfig(**GQA), LlmConfig(**MLA)
    assert kv_bytes_read_per_token(gqa, 4) == kv_bytes_per_token(gqa) == 32 * 2 * 8 * 128 * 2
    assert kv_bytes_read_per_token(gqa, 16) == 2 * kv_bytes_per_token(gqa)
    assert kv_bytes_read_per_token(mla, 8) == 8 * kv_bytes_per_token(mla) == 8 * 61 * 576 * 2


def test_linear_attention_state_per_sequence():
    """Qwen3.5-397B's 45 gated-DeltaNet layers, 64 x 128 x 128 float32 each: 180 MiB a
    sequence; a state without linear-attention layers is an error."""
    qwen35 = LlmConfig(
        **dict(
            GQA,
            num_layers=60,
            num_linear_attention_layers=45,
            linear_state_elements_per_layer=64 * 128 * 128,
        )
    )
    assert linear_state_bytes(qwen35) == 45 * 64 * 128 * 128 * 4 == 180 * 2**20
    assert linear_state_bytes(LlmConfig(**GQA)) == 0
    with pytest.raises(ValidationError, match="needs num_linear_attention_layers"):
        LlmConfig(**dict(GQA, linear_state_elements_per_layer=10))
