"""Small adapters and base-model configs for tests, in PEFT's exact file format.

`peft_adapter_files` writes what PEFT's save_pretrained writes (config keys and tensor
names), without running PEFT, so tests that need many adapters stay fast; the round-trip
tests use PEFT itself.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import save

from adapters.format.base_model import BaseModelSpec, module_group

TINY_BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "dtype": "float32",
}
TINY_SPEC = BaseModelSpec.from_config(TINY_BASE)


def peft_config(rank=8, alpha=16, modules=("q_proj", "v_proj"), **extra) -> dict:
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "tiny-llama",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "fan_in_fan_out": False,
    }
    config.update(extra)
    return config


def peft_tensors(rank=8, modules=("q_proj", "v_proj"), spec=TINY_SPEC, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.num_layers):
        for m in modules:
            fan_in, fan_out = spec.shapes[m]
            prefix = f"base_model.model.model.layers.{layer}.{module_group(m)}.{m}"
            # A at PEFT's init scale (1/sqrt(in)); B of std 1, above a trained B, so effects show
            a = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            tensors[f"{prefix}.lora_A.weight"] = a.to(dtype)
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen).to(dtype)
    return tensors


def peft_adapter_files(
    rank=8, alpha=16, modules=("q_proj", "v_proj"), seed=0, **extra
) -> dict[str, bytes]:
    """{adapter_config.json, adapter_model.safetensors} bytes of a random LoRA for TINY_BASE."""
    return {
        "adapter_config.json": json.dumps(
            peft_config(rank, alpha, modules, **extra), indent=2
        ).encode(),
        "adapter_model.safetensors": save(peft_tensors(rank, modules, seed=seed)),
    }
