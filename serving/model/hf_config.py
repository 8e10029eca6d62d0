"""The served model's shape and numerics, read from a Hugging Face folder's config.json.

Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Phi-3 (Phi-4), Gemma 2 and Gemma 3 only: the Llama
family this runtime implements (Qwen3 adds an RMSNorm on each head of q and k; Phi-3 stores
q/k/v and gate/up fused, split on loading; Gemma's differences are read in
serving.model.gemma_config, Qwen3-MoE's sparse MLP in serving.model.moe_config).
The RoPE settings are read in either layout by serving.model.rope_config. The checkpoint
dtype is `torch_dtype` (4.x) or `dtype` (5.x). Precedence follows transformers 5 reading
either layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adapters.format.multimodal import MULTIMODAL, TEXT_PREFIXES, text_model_config
from serving.model.errors import ModelLoadError
from serving.model.fp8_formats import Fp8Format, fp8_format
from serving.model.gemma_config import gemma_fields, gemma_rope
from serving.model.layer_types import sliding_layers
from serving.model.moe_config import MOE_ARCHITECTURES, moe_fields
from serving.model.rope_config import RopeScaling, parse_rope

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    MULTIMODAL[0]: "gemma3",  # its text model; the vision tower is not served
}
# attention_bias read from the config, on q, k, v and o
BIAS_FLAGGED = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
                *MOE_ARCHITECTURES, *MULTIMODAL)  # fmt: skip
QK_NORMED = ("Qwen3ForCausalLM", *MOE_ARCHITECTURES)  # an RMSNorm on each head of q and k
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about the base model's architecture."""

    architecture: str  # a key of SUPPORTED_ARCHITECTURES
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q_proj, k_proj, v_proj carry a bias (Qwen2; Llama's, Qwen3's flag)
    o_proj_bias: bool  # o_proj carries a bias (Llama's and Qwen3's attention_bias)
    mlp_bias: bool  # gate/up/down carry a bias (Llama's mlp_bias)
    rope_theta: float
    rope_scaling: RopeScaling | None
    torch_dtype: torch.dtype  # the checkpoint's dtype
    sliding_window: int | None  # attention window of the layers in sliding_window_layers
    sliding_window_layers: tuple[int, ...]  # empty when sliding_window is None
    eos_token_ids: tuple[int, ...]  # generation stops at any of them
    qk_norm: bool = False  # an RMSNorm over each head of q and of k before RoPE (Qwen3)
    fused_linears: bool = False  # qkv_proj and gate_up_proj in the checkpoint (Phi-3)
    # Gemma 3 (serving.model.gemma_config); the defaults are the Llama family's
    norm_offset: float = 0.0  # every RMSNorm scales by (offset + w)
    embed_scale: float | None = None  # the embedding's rows are multiplied by it
    sandwich_norms: bool = False  # a norm on attention's output and on the MLP's, too
    activation: str = "silu"  # of the gated MLP: silu or gelu_tanh
    attn_scale: float | None = None  # None: head_dim ** -0.5
    local_rope_theta: float | None = None  # the sliding layers' RoPE base, where it differs
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    attn_softcap: float | None = None  # each attention score s = cap * tanh(s / cap) (Gemma 2)
    # (checkpoint prefix, the text model's) of a multimodal checkpoint's language model
    text_prefixes: tuple[tuple[str, str], ...] = ()
    # A sparse MLP in every layer (serving.model.moe_config); 0 experts: a dense MLP
    num_experts: int = 0
    experts_per_token: int = 0  # how many experts each token's output sums
    moe_intermediate_size: int = 0  # each expert's MLP width
    norm_topk_prob: bool = False  # the kept experts' weights renormalized to sum 1
    # How a pre-quantized checkpoint stores its FP8 linears (serving.model.fp8_formats)
    fp8: Fp8Format | None = None


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Read and check config.json (and generation_config.json for the stop tokens)."""
    path = Path(model_dir) / "config.json"
    raw = _read_json(path, required=True)
    return parse_model_config(raw, where=str(path), eos_token_ids=read_eos_token_ids(model_dir))


def read_eos_token_ids(model_dir: str | Path) -> tuple[int, ...]:
    """Stop tokens: generation_config.json's eos_token_id, else config.json's; maybe none."""
    for name in ("generation_config.json", "config.json"):
        raw = _read_json(Path(model_dir) / name, required=False)
        value = (raw or {}).get("eos_token_id")
        if value is not None:
            ids = value if isinstance(value, list) else [value]
            if all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                return tuple(ids)
            raise ModelLoadError(f"{Path(model_dir) / name}: eos_token_id {value!r} is not ints")
    return ()


def parse_model_config(
    raw: dict[str, Any], where: str = "config.json", eos_token_ids: tuple[int, ...] = ()
) -> ModelConfig:
    """A ModelConfig from a parsed config.json; `where` names the source in error messages."""
    arch = _architecture(raw, where)
    fp8 = fp8_format(raw, where)  # at the top level, a multimodal checkpoint's too
    prefixes = ()
    if arch in MULTIMODAL:
        try:
            raw, prefixes = text_model_config(raw), TEXT_PREFIXES
        except ValueError as exc:
            raise ModelLoadError(f"{where}: {exc}") from None
    gemma = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 3, MULTIMODAL[0]: 3}.get(arch)
    local_theta = None
    if gemma == 3:
        raw, local_theta = gemma_rope(raw)
    if not gemma and raw.get("hidden_act", "silu") != "silu":  # Gemma's: gemma_fields
        raise ModelLoadError(f"{where}: hidden_act {raw['hidden_act']!r} is not supported (silu)")
    rope_params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    if raw.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelLoadError(f"{where}: partial_rotary_factor other than 1.0 is not supported")
    hidden = _int(raw, "hidden_size", where)
    heads = _int(raw, "num_attention_heads", where)
    kv_heads = _int(raw, "num_key_value_heads", where, default=heads)
    head_dim = _int(raw, "head_dim", where, default=hidden // heads)
    if heads % kv_heads:
        raise ModelLoadError(f"{where}: {heads} attention heads is not a multiple of {kv_heads}")
    if head_dim % 2:
        raise ModelLoadError(f"{where}: head_dim {head_dim} is odd; RoPE needs it even")
    num_layers = _int(raw, "num_hidden_layers", where)
    max_pos = _int(raw, "max_position_embeddings", where)
    theta, scaling = parse_rope(raw, max_pos, where)
    window, window_layers = _sliding_window(raw, arch, num_layers, where)
    family = gemma_fields(raw, hidden, num_layers, where, gemma) if gemma else {}
    if arch in MOE_ARCHITECTURES:
        family = moe_fields(raw, where)
    if gemma:
        window_layers = family.pop("sliding_window_layers")
        window = _int(raw, "sliding_window", where) if window_layers else None
        if prefixes:  # the multimodal model's forward caps no logits, whatever its text_config
            family["final_logit_softcap"] = None
    # Llama's and Qwen3's attention_bias covers o_proj too; Qwen2 always biases q/k/v, never o
    flag_bias = arch in BIAS_FLAGGED and bool(raw.get("attention_bias", False))
    return ModelConfig(
        architecture=arch,
        hidden_size=hidden,
        # unused by a sparse model's layers, and some MoE configs leave it out
        intermediate_size=_int(raw, "intermediate_size", where, default=1),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=_int(raw, "vocab_size", where),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=arch == "Qwen2ForCausalLM" or flag_bias,
        o_proj_bias=flag_bias,
        mlp_bias=arch == "LlamaForCausalLM" and bool(raw.get("mlp_bias", False)),
        rope_theta=theta,
        rope_scaling=scaling,
        torch_dtype=_dtype(raw, where),
        sliding_window=window,
        sliding_window_layers=window_layers,
        eos_token_ids=tuple(eos_token_ids),
        fused_linears=arch == "Phi3ForCausalLM",
        local_rope_theta=local_theta,
        text_prefixes=prefixes,
        fp8=fp8,
        **{"qk_norm": arch in QK_NORMED, **family},
    )


def _read_json(path: Path, required: bool) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if required:
            raise ModelLoadError(f"{path} not found") from None
        return None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def _architecture(raw: dict[str, Any], where: str) -> str:
    names = raw.get("architectures") or []
    if not names:  # a bare config.save_pretrained writes no architectures; use model_type
        by_type = {t: a for a, t in SUPPORTED_ARCHITECTURES.items()}
        names = [by_type.get(raw.get("model_type"), f"model_type {raw.get('model_type')!r}")]
    if names[0] not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise ModelLoadError(
            f"{where}: architecture {names[0]} is not supported; supported: {supported}"
        )
    return names[0]


def _int(raw: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = raw.get(key)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        shown = "missing" if value is None else repr(value)
        raise ModelLoadError(f"{where}: {key} must be a positive integer, got {shown}")
    return value


def _dtype(raw: dict[str, Any], where: str) -> torch.dtype:
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    dtype = _DTYPES.get(str(name).removeprefix("torch."))
    if dtype is None:
        raise ModelLoadError(f"{where}: dtype {name!r} is not one of {', '.join(_DTYPES)}")
    return dtype


def _sliding_window(
    raw: dict[str, Any], arch: str, num_layers: int, where: str
) -> tuple[int | None, tuple[int, ...]]:
    window = raw.get("sliding_window")
    if arch == "LlamaForCausalLM" or window is None:
        return None, ()
    if arch in MOE_ARCHITECTURES:  # Qwen3-MoE: every layer slides when one does
        if not raw.get("use_sliding_window", False):
            return None, ()
        layers = tuple(range(num_layers))
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        if not raw.get("use_sliding_window", False):
            return None, ()  # Qwen writes a window it does not use unless use_sliding_window
        types = raw.get("layer_types")
        if types is None:  # transformers' rule: layers from max_window_layers on slide
            start = raw.get("max_window_layers", 28)
            types = [
                "sliding_attention" if i >= start else "full_attention" for i in range(num_layers)
            ]
        layers = sliding_layers(types, num_layers, where)
    else:
        layers = tuple(range(num_layers))
    return _int(raw, "sliding_window", where), layers
