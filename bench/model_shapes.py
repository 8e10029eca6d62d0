"""Random-weight Llama checkpoints of real shapes, built in memory for the model benchmarks."""

from __future__ import annotations

import torch

from serving.model.hf_config import parse_model_config

SHAPES = {
    # name: hidden, intermediate, layers, heads, kv heads, vocab
    "cpu-1b-ish": (1024, 2816, 8, 16, 4, 32000),
    "llama-8b": (4096, 14336, 32, 32, 8, 128256),
    "llama-1b": (2048, 8192, 16, 32, 8, 128256),  # Llama 3.2 1B: the 8B's draft
    "tiny": (64, 128, 2, 4, 2, 256),
    "tiny-draft": (64, 128, 1, 4, 2, 256),
    "medium": (768, 2048, 12, 12, 4, 8192),  # about 100M parameters
    "tiny-long": (256, 688, 4, 4, 2, 8192),
}


def config_for(name: str, dtype: str = "bfloat16"):
    hidden, inter, layers, heads, kv, vocab = SHAPES[name]
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "torch_dtype": dtype,
    }
    return parse_model_config(raw)


def random_state(config, dtype: torch.dtype, device: str = "cpu") -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with the right names and shapes, small random values."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
        "lm_head.weight": (c.vocab_size, c.hidden_size),
    }
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            f"{p}input_layernorm.weight": (c.hidden_size,),
            f"{p}post_attention_layernorm.weight": (c.hidden_size,),
            f"{p}self_attn.q_proj.weight": (q, c.hidden_size),
            f"{p}self_attn.k_proj.weight": (kv, c.hidden_size),
            f"{p}self_attn.v_proj.weight": (kv, c.hidden_size),
            f"{p}self_attn.o_proj.weight": (c.hidden_size, q),
            f"{p}mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            f"{p}mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            f"{p}mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        }
    state = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape, dtype=dtype, device=device)
        else:
            state[name] = torch.randn(shape, dtype=dtype, device=device) * shape[-1] ** -0.5
    return state


def weight_bytes(model) -> tuple[int, int]:
    """(bytes of the decoder linears with their scales, bytes of everything)."""
    linears = 0
    for layer in model.layers:
        for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
            linears += lin.weight.numel() * lin.weight.element_size()
            if lin.scale is not None:
                linears += lin.scale.numel() * lin.scale.element_size()
    others = sum(t.numel() * t.element_size() for t in (model.embed, model.norm))
    others += (
        0 if model.lm_head is model.embed else model.lm_head.numel() * model.lm_head.element_size()
    )
    others += sum(
        2 * layer.input_norm.numel() * layer.input_norm.element_size() for layer in model.layers
    )
    return linears, linears + others
