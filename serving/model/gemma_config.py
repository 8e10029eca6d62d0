"""Gemma 3's own config fields, read into ModelConfig's (serving.model.hf_config).

Gemma 3 is the Llama decoder with: RMSNorms that scale by (1 + w); the embedding scaled by
sqrt(hidden_size); a norm after attention and after the MLP besides the two before them; an
RMSNorm on each head of q and k; GELU (tanh) in the MLP; attention scaled by
query_pre_attn_scalar ** -0.5; sliding layers (`layer_types`, or every layer but each
`sliding_window_pattern`-th) with a RoPE of their own base (`rope_local_base_freq`, or
`rope_parameters.sliding_attention`); and an optional final logit soft-cap. Attention logit
soft-capping (Gemma 2) and bidirectional attention are refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from serving.model.errors import ModelLoadError

GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")


def gemma_fields(raw: dict[str, Any], hidden: int, num_layers: int, where: str) -> dict:
    """ModelConfig's fields that Gemma 3 sets, from its config.json (raw)."""
    if raw.get("attn_logit_softcapping") is not None:
        raise ModelLoadError(f"{where}: attention logit soft-capping (attn_logit_softcapping) "
                             "is not supported")  # fmt: skip
    if raw.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{where}: use_bidirectional_attention is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in GEMMA_ACTIVATIONS:
        raise ModelLoadError(f"{where}: hidden_activation {act!r} is not supported "
                             f"({', '.join(GEMMA_ACTIVATIONS)})")  # fmt: skip
    types = raw.get("layer_types")
    if types is None:  # transformers 4: every sliding_window_pattern-th layer is global
        pattern = int(raw.get("sliding_window_pattern", 6))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(num_layers)]  # fmt: skip
    cap = raw.get("final_logit_softcapping")
    scalar = raw.get("query_pre_attn_scalar") or raw.get("head_dim") or 256
    return {
        "norm_offset": 1.0,
        "embed_scale": math.sqrt(hidden),
        "sandwich_norms": True,
        "qk_norm": True,
        "activation": "gelu_tanh",
        "attn_scale": float(scalar) ** -0.5,
        "sliding_window_layers": tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        "final_logit_softcap": None if cap is None else float(cap),
    }


def gemma_rope(raw: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """(the global layers' RoPE settings as one flat config, the sliding layers' base)."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:  # transformers 5, per type
        local = params.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise ModelLoadError("the sliding layers' RoPE scaling is not supported")
        flat = {k: v for k, v in raw.items() if k != "rope_parameters"}
        return {**flat, "rope_parameters": params["full_attention"]}, float(
            local.get("rope_theta", 10000.0)
        )
    return raw, float(raw.get("rope_local_base_freq", 10000.0))
