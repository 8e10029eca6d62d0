"""The kit's Llama base, its draft, and their LoRA adapters, built and saved with transformers + PEFT."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tokenizers import Tokenizer
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from .tokenizer import EOS, save_tokenizer, stop_ids

LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Shape:
    """A Llama's size; the draft keeps the width and takes fewer layers."""

    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 688
    max_len: int = 2048


DEFAULT_SHAPE = Shape()


def new_base(tok: Tokenizer, shape: Shape, seed: int) -> LlamaForCausalLM:
    """A freshly initialised Llama with tied embeddings (they are a quarter of its weights)."""
    torch.manual_seed(seed)
    stops = stop_ids(tok)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_len,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=stops,
        pad_token_id=tok.token_to_id(EOS),
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=config.pad_token_id)
    return model


def new_draft(base: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """A `layers`-deep Llama that starts from the base's embeddings, first layers and final norm."""
    config = copy.deepcopy(base.config)
    config.num_hidden_layers = layers
    draft = LlamaForCausalLM(config)
    missing, _ = draft.load_state_dict(base.state_dict(), strict=False)
    assert not [m for m in missing if m != "lm_head.weight"], (
        missing
    )  # tied: lm_head is the embedding
    draft.generation_config = copy.deepcopy(base.generation_config)
    return draft


def with_lora(model: LlamaForCausalLM, rank: int, seed: int) -> PeftModel:
    """A copy of model with a fresh trainable rank-`rank` LoRA on every linear."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=LORA_MODULES, task_type="CAUSAL_LM")  # fmt: skip
    return get_peft_model(copy.deepcopy(model), config)


def save_model(model: LlamaForCausalLM, tok: Tokenizer, out: Path) -> None:
    """config.json, model.safetensors (fp32), generation_config.json and the tokenizer files."""
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out, model.config.max_position_embeddings)


def save_adapter(model: PeftModel, out: Path, base_path: str) -> None:
    """adapter_config.json + adapter_model.safetensors, naming the kit's base by its path."""
    model.peft_config["default"].base_model_name_or_path = base_path
    # never the embeddings: PEFT adds them when a model at base_path has another vocabulary
    model.save_pretrained(out, safe_serialization=True, save_embedding_layers=False)
    (out / "README.md").unlink(missing_ok=True)  # PEFT's blank model card; the kit has one card
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] > 0 and (out / "adapter_model.safetensors").exists()


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
