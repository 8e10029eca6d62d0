"""Draft models for the engine world: a 1-layer draft cut from the base, and the base itself
(a perfect draft, so every proposal is kept and stops land inside accepted runs)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.engine.engine import Engine, EngineConfig
from serving.engine.scheduler import SchedulerConfig
from serving.engine.speculative.config import SpecConfig
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from tests.serving.engine.world import FIELDS, World, base_model


def runtime_model(folder) -> LlamaModel:
    return LlamaModel(
        load_model_config(folder), load_state_dict(folder), fp8=False, dtype=torch.float32
    )


def save_draft(world: World) -> None:
    """world.root/draft: the base's embeddings and first layer, one layer deep."""
    base = base_model()
    draft = LlamaForCausalLM(LlamaConfig(**{**FIELDS, "num_hidden_layers": 1}))
    draft.load_state_dict(base.state_dict(), strict=False)
    draft.save_pretrained(world.root / "draft")


def spec_engine(world: World, method: str, *, draft: str = "small", k: int = 4, num_blocks=256,
                scheduler: SchedulerConfig | None = None, companions=(), embeddings=False,
                **spec) -> Engine:  # fmt: skip
    """world.engine() with speculation; draft "small" (1 layer) or "same" (the base itself).

    companions: adapter names whose own LoRA is also their draft companion.
    embeddings: both slabs serve embed_tokens/lm_head LoRA (lora.embeddings).
    """
    if method == "draft_model" and not (world.root / "draft").exists():
        save_draft(world)
    folder = world.root / ("draft" if draft == "small" else "base")
    draft_model = runtime_model(folder) if method == "draft_model" else None
    draft_slab = None
    if companions:
        spec_of = BaseModelSpec.from_dir(folder)

        def companion(version: str):
            name = version.partition("@")[0]
            if name not in companions:
                raise LookupError(f"{version} has no draft companion")
            return load_adapter(world.root / name, base=spec_of)

        draft_slab = AdapterSlab(
            spec_of, num_slots=4, max_rank=16, max_cpu_loras=0, loader=companion,
            base_weight=draft_model.served_weight, embeddings=embeddings,
        )  # fmt: skip
    config = {"block_size": 4, "num_blocks": num_blocks, "max_model_len": 256,
              "speculative": SpecConfig(method=method, num_speculative_tokens=k, adaptive=False, **spec)}  # fmt: skip
    if scheduler is not None:
        config["scheduler"] = scheduler
    model = runtime_model(world.base_dir)
    slab = AdapterSlab(BaseModelSpec.from_dir(world.base_dir), num_slots=8, max_rank=16,
                       max_cpu_loras=0, loader=world.adapters.__getitem__,
                       base_weight=model.served_weight, embeddings=embeddings)  # fmt: skip
    return Engine(model, world.tokenizer, EngineConfig(**config), slab=slab,
                  draft_model=draft_model, draft_slab=draft_slab)  # fmt: skip
