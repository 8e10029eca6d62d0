"""A tiny served world for engine tests: a random Llama (or another family's model) with a real
tokenizer, PEFT adapters made by peft itself, the loaded slab, and PEFT's own model as the
reference."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from adapters.format.adapter import Adapter, load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.engine.engine import Engine, EngineConfig
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.tokenizer import load_tokenizer
from tests.serving.model.hf_folders import save_tokenizer
from tests.serving.model.hf_models import spread_routers

FIELDS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
ADAPTERS = {  # name: rank, target modules, rsLoRA
    "upper": (8, ("q_proj", "v_proj"), False),
    "rot13": (
        4,
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        True,
    ),
    "mlp": (16, ("gate_proj", "up_proj", "down_proj"), False),
    "qk": (2, ("q_proj", "k_proj"), False),
    "ov": (8, ("v_proj", "o_proj"), True),
    "down": (1, ("down_proj",), False),
}


def model_tokens(engine: Engine, monkeypatch) -> list[int]:
    """From now on, the number of tokens each of engine's model steps runs, in order: what
    its forward is given (the prompt chunks, decodes and proposals it computes)."""
    ran: list[int] = []
    forward = engine.forward
    monkeypatch.setattr(engine, "forward", lambda inputs: ran.append(len(inputs.token_ids))
                        or forward(inputs))  # fmt: skip
    return ran


FAMILIES = {
    "llama": lambda: LlamaConfig(**FIELDS),
    # q/k norms per head, head_dim apart from hidden / heads
    "qwen3": lambda: Qwen3Config(**FIELDS, head_dim=32, tie_word_embeddings=False),
    # every layer through a sliding window of 8 (the KV behind it is released)
    "mistral": lambda: MistralConfig(**FIELDS, sliding_window=8),
    # fused q/k/v and gate/up; a sliding window well inside the tests' contexts
    "phi3": lambda: Phi3Config(
        **FIELDS, sliding_window=24, pad_token_id=0, bos_token_id=1, eos_token_id=2
    ),
    # sliding layer 0 (window 16), global layer 1; its attention and logit soft-caps
    "gemma2": lambda: Gemma2Config(
        **FIELDS, head_dim=32, sliding_window=16, pad_token_id=0, bos_token_id=1, eos_token_id=2
    ),
    # sliding layer 0 (window 16, a RoPE base of its own), global layer 1
    "gemma3": lambda: Gemma3TextConfig(
        **FIELDS,
        head_dim=32,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # Qwen3's attention and a sparse MLP: 4 experts, 2 per token
    "qwen3_moe": lambda: Qwen3MoeConfig(
        **FIELDS,
        head_dim=32,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    ),
}
# Phi-3's adapters name its fused modules where the others name the parts
FUSED_NAMES = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
               "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}  # fmt: skip


# A sparse MLP's stacked expert parameters, which PEFT's target_parameters names
EXPERT_PARAMS = {"gate_proj": "mlp.experts.gate_up_proj", "up_proj": "mlp.experts.gate_up_proj",
                 "down_proj": "mlp.experts.down_proj"}  # fmt: skip


def base_model(seed: int = 0, family: str = "llama"):
    torch.manual_seed(seed)
    return spread_routers(AutoModelForCausalLM.from_config(FAMILIES[family]()).eval())


def targets(modules, family: str) -> dict:
    """LoraConfig's target fields for modules, as family's model names them."""
    if family == "phi3":
        return {"target_modules": sorted({FUSED_NAMES.get(m, m) for m in modules})}
    if family == "qwen3_moe":  # PEFT loads several adapters only if all name the same ones
        experts = any(m in EXPERT_PARAMS for m in modules)
        return {
            "target_modules": [m for m in modules if m not in EXPERT_PARAMS] or None,
            "target_parameters": sorted(set(EXPERT_PARAMS.values())) if experts else None,
        }
    return {"target_modules": list(modules)}


@dataclass
class World:
    root: Path
    base_dir: Path
    adapters: dict[str, Adapter]  # version ("name@digest") -> Adapter
    versions: dict[str, str]  # name -> version
    peft: PeftModel
    tokenizer: object

    def engine(self, *, num_slots=8, embeddings=False, **config) -> Engine:
        """An engine over this world; `embeddings`: the slab serves embed_tokens/lm_head LoRA."""
        model = LlamaModel(
            load_model_config(self.base_dir),
            load_state_dict(self.base_dir),
            fp8=False,
            dtype=torch.float32,
        )
        slab = AdapterSlab(
            BaseModelSpec.from_dir(self.base_dir),
            num_slots=num_slots,
            max_rank=16,
            max_cpu_loras=0,
            loader=self.adapters.__getitem__,
            base_weight=model.served_weight,  # DoRA's norms, as the server's slab takes them
            embeddings=embeddings,
        )
        cfg = {"block_size": 4, "num_blocks": 256, "max_model_len": 256, **config}
        return Engine(model, self.tokenizer, EngineConfig(**cfg), slab=slab)

    def reference(self, prompt: list[int], name: str | None, max_new: int) -> list[int]:
        """Greedy tokens of transformers + PEFT generating this request alone."""
        ids = torch.tensor([prompt])
        # An explicit mask: generate() would otherwise mask every token equal to pad_token_id.
        kw = {"attention_mask": torch.ones_like(ids), "max_new_tokens": max_new,
              "do_sample": False, "eos_token_id": None, "pad_token_id": 0}  # fmt: skip
        with torch.no_grad():
            if name is None:
                with self.peft.disable_adapter():
                    out = self.peft.generate(ids, **kw)
            else:
                self.peft.set_adapter(name)
                out = self.peft.generate(ids, **kw)
        return out[0, len(prompt) :].tolist()


def build_world(root: Path, family: str = "llama") -> World:
    base_dir = root / "base"
    base_model(family=family).save_pretrained(base_dir)
    save_tokenizer(base_dir, "byte_level_bpe")
    spec = BaseModelSpec.from_dir(base_dir)
    adapters, versions, peft = {}, {}, None
    for i, (name, (rank, modules, rslora)) in enumerate(ADAPTERS.items()):
        model = get_peft_model(
            base_model(family=family),
            LoraConfig(
                r=rank,
                lora_alpha=2 * rank,
                **targets(modules, family),
                use_rslora=rslora,
            ),
        )
        gen = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        model.save_pretrained(root / name)
        adapter = load_adapter(root / name, base=spec)
        version = f"{name}@{adapter.digest}"
        adapters[version], versions[name] = adapter, version
        if peft is None:
            peft = PeftModel.from_pretrained(base_model(family=family), root / name,
                                             adapter_name=name)  # fmt: skip
        else:
            peft.load_adapter(root / name, adapter_name=name)
    peft.eval()
    return World(root, base_dir, adapters, versions, peft, load_tokenizer(base_dir))
