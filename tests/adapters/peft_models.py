"""Real PEFT adapters on a tiny random Llama, saved with PEFT's own save_pretrained."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from tests.adapters.factory import TINY_BASE


def tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    fields = {k: v for k, v in TINY_BASE.items() if k not in ("architectures", "model_type")}
    return LlamaForCausalLM(LlamaConfig(**fields | overrides))


def save_base(path: Path) -> Path:
    tiny_llama().save_pretrained(path)
    return path


def save_peft_adapter(
    path: Path, *, rank: int, modules, alpha: int = 16, rslora=False, seed=0, base=None, **extra
):
    """Save a LoRA with random (non-zero) A and B (and lora_B biases); DoRA magnitudes are
    the base's row norms, randomly perturbed. `extra` goes to LoraConfig (use_dora,
    rank_pattern, ...). Returns (path, the PEFT model)."""
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(modules), use_rslora=rslora, **extra
    )
    model = get_peft_model(base if base is not None else tiny_llama(), config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "trainable_tokens_delta" in name:  # the rows themselves: move them off the base's
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "lora_magnitude_vector" in name:
                p.mul_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            elif "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(path)
    return path, model
