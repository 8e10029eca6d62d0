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

from serving.model.errors import ModelLoadError

GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")
MULTIMODAL = "Gemma3ForConditionalGeneration"  # Gemma 3 4B and up: text served, vision not
# where the language model's tensors live in a multimodal checkpoint, as transformers writes
# them (4.x and 5.x) and loads them: renamed to the text model's names, the rest left out
TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                 ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."))  # fmt: skip


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A multimodal Gemma 3's config.json as its text model's: text_config, with the
    checkpoint's dtype and tied embeddings from the top level where text_config lacks them."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ModelLoadError(f"{MULTIMODAL} config.json has no text_config object")
    top = {k: raw[k] for k in ("dtype", "torch_dtype", "tie_word_embeddings") if k in raw}
    return {**top, **{k: v for k, v in text.items() if v is not None},
            "architectures": ["Gemma3ForCausalLM"]}  # fmt: skip


def text_weights(state: dict, prefixes: tuple[tuple[str, str], ...]) -> dict:
    """state's language-model tensors under the text model's names (no copies made)."""
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
        pattern = int(raw.get("sliding_window_pattern", 6))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(num_layers)]  # fmt: skip
    cap = raw.get("final_logit_softcapping")
    attn_cap = raw.get("attn_logit_softcapping") if version == 2 else None
    scalar = raw.get("query_pre_attn_scalar") or raw.get("head_dim") or 256
    return {
        "norm_offset": 1.0,
        "embed_scale": math.sqrt(hidden),
        "sandwich_norms": True,
        "qk_norm": version == 3,
        "attn_softcap": None if attn_cap is None else float(attn_cap),
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
