"""Tiny random Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Phi-3, Gemma 2 and Gemma 3 checkpoints
written by transformers' save_pretrained."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

COMMON = {"vocab_size": 211, "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
CONFIGS = {
    # GQA 4/2, untied
    "llama": lambda: LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **COMMON,
    ),
    # llama3 RoPE scaling, tied embeddings, heads not a power of two (6 / 3 kv, head_dim 8)
    "llama3-tied": lambda: LlamaConfig(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        **COMMON,
    ),
    "mistral": lambda: MistralConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        sliding_window=None,
        **COMMON,
    ),
    # attention bias on q/k/v, 6 heads / 2 kv heads
    "qwen2": lambda: Qwen2Config(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        **COMMON,
    ),
    # q/k norms per head, head_dim 16 set apart from hidden / heads (8), tied embeddings
    "qwen3": lambda: Qwen3Config(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        **COMMON,
    ),
    # Qwen3's attention, a sparse MLP in every layer: 6 experts, 2 per token, renormalized
    "qwen3_moe": lambda: Qwen3MoeConfig(
        hidden_size=48,
        intermediate_size=80,
        moe_intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=6,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        **COMMON,
    ),
    # q/k/v and gate/up stored fused (qkv_proj, gate_up_proj), GQA 6 / 2
    "phi3": lambda: Phi3Config(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **COMMON,
    ),
    # Gemma 2: attention scores soft-capped (small enough to bend these), the even layers
    # sliding (window 5), a final logit soft-cap
    "gemma2": lambda: Gemma2Config(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=5,
        attn_logit_softcapping=0.5,
        final_logit_softcapping=1.0,
        initializer_range=0.3,  # scores large enough for the cap to bend them
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **COMMON,
    ),
    # (1 + w) norms, sandwich norms, q/k norms, GELU, a scaled embedding; sliding layers 0-2
    # (window 5, a RoPE base of their own) and a global layer 3 with linear RoPE scaling; a
    # final logit soft-cap
    "gemma3": lambda: Gemma3TextConfig(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=5,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
        },
        final_logit_softcapping=1.0,  # small enough to bend these logits
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **COMMON,
    ),
    # Qwen3's attention_bias: q, k, v and o all biased
    "qwen3-bias": lambda: Qwen3Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        attention_bias=True,
        tie_word_embeddings=False,
        **COMMON,
    ),
}


def save_tiny(kind: str, path: Path, seed: int = 0, **overrides) -> tuple[Path, torch.nn.Module]:
    """Save a random model of `kind` (float32) to path; returns (path, the transformers model)."""
    torch.manual_seed(seed)
    config = CONFIGS[kind]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # random biases too, so a dropped bias shows
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith("mlp.gate.weight"):  # a router: as spread_routers, in turn
                p.copy_(torch.randn_like(p))

    model.eval()
    model.save_pretrained(path)
    return path, model


def spread_routers(model: torch.nn.Module) -> torch.nn.Module:
    """model with each sparse MLP's router drawn at unit scale: its scores far apart, so no
    near tie between experts turns on rounding. Returns model."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn_like(p))
    return model
