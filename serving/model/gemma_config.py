"""Gemma 2's and 3's own config fields, read into ModelConfig's (serving.model.hf_config).

Gemma 3 is the Llama decoder with: RMSNorms that scale by (1 + w); the embedding scaled by
sqrt(hidden_size); a norm after attention and after the MLP besides the two before them; an
RMSNorm on each head of q and k; GELU (tanh) in the MLP; attention scaled by
query_pre_attn_scalar ** -0.5; sliding layers (`layer_types`, or every layer but each
`sliding_window_pattern`-th) with a RoPE of their own base (`rope_local_base_freq`, or
`rope_parameters.sliding_attention`); and an optional final logit soft-cap. Gemma 2 differs:
no q/k norms, one RoPE for every layer, every other layer sliding (the even ones) where
`layer_types` is not written, and attention scores soft-capped (attn_logit_softcapping).
Bidirectional attention is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from adapters.format.multimodal import TEXT_PREFIXES
from serving.model.errors import ModelLoadError
from serving.model.layer_types import sliding_layers

GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")


def text_weights(state: dict, prefixes: tuple[tuple[str, str], ...] = TEXT_PREFIXES) -> dict:
    """state's language-model tensors under the text model's names (no copies made); a state
    already under them is returned as it is."""
    if any(name.startswith("model.layers.") for name in state):
        return state
    out = {}
    for name, tensor in state.items():
        for prefix, to in prefixes:
            if name.startswith(prefix):
                out.setdefault(to + name[len(prefix) :], tensor)
                break
    return out


def gemma_fields(
    raw: dict[str, Any], hidden: int, num_layers: int, where: str, version: int = 3
) -> dict:
    """ModelConfig's fields that Gemma 2 or 3 (version) sets, from its config.json (raw)."""
    if version == 3 and raw.get("attn_logit_softcapping") is not None:
        raise ModelLoadError(f"{where}: attention logit soft-capping (attn_logit_softcapping) "
                             "is Gemma 2's; Gemma 3 has none")  # fmt: skip
    if raw.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{where}: use_bidirectional_attention is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in GEMMA_ACTIVATIONS:
        raise ModelLoadError(f"{where}: hidden_activation {act!r} is not supported "
                             f"({', '.join(GEMMA_ACTIVATIONS)})")  # fmt: skip
    types = raw.get("layer_types")
    if types is None and version == 2:  # transformers 4: the even layers slide
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]
    if types is None:  # transformers 4: every sliding_window_pattern-th layer is global
        pattern = raw.get("sliding_window_pattern", 6)
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise ModelLoadError(f"{where}: sliding_window_pattern must be a positive integer, "
                                 f"got {pattern!r}")  # fmt: skip
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(num_layers)]  # fmt: skip
    # transformers' defaults where a key is absent: Gemma 2 caps at 50 and 30, Gemma 3 not
    default_caps = (50.0, 30.0) if version == 2 else (None, None)
    attn_cap = raw.get("attn_logit_softcapping", default_caps[0]) if version == 2 else None
    cap = raw.get("final_logit_softcapping", default_caps[1])
    scalar = raw.get("query_pre_attn_scalar") or 256
    return {
        "norm_offset": 1.0,
        "embed_scale": math.sqrt(hidden),
        "sandwich_norms": True,
        "qk_norm": version == 3,
        "attn_softcap": None if attn_cap is None else float(attn_cap),
        "activation": "gelu_tanh",
        "attn_scale": float(scalar) ** -0.5,
        "sliding_window_layers": sliding_layers(types, num_layers, where),
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
