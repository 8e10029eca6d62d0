"""The newer base families on the GPU, a check of bench/gpu_all.py: Qwen3 (q/k norms), Phi-3
(fused linears, adapters on them, a sliding window inside the prompts), Gemma 3 (sliding
and global layers) and Qwen3-MoE (the grouped expert kernels, LoRA on every expert) with a
different adapter per row, the device's step against the same
model's on the CPU; Gemma 2's attention soft-cap in the Triton kernel too.

Tiny random checkpoints and PEFT adapters made here, so nothing is downloaded. fp32 with TF32
off must agree with the CPU to 1e-3; bf16 and FP8 are reported as their relative logit error
against it (the Triton attention with its window, the Triton LoRA kernels, the FP8 linear).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    Phi3Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.step_plan import StepSeq, build_step, plan_step

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=1024, max_position_embeddings=1024)  # fmt: skip
FAMILIES = {
    "qwen3": (lambda: Qwen3Config(**SHAPE, head_dim=64), ["q_proj", "k_proj", "v_proj",
                                                          "o_proj", "down_proj"]),
    "phi3": (lambda: Phi3Config(**SHAPE, sliding_window=48, pad_token_id=0),
             ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
    "gemma2": (lambda: Gemma2Config(**SHAPE, head_dim=64, sliding_window=40, pad_token_id=0),
               ["q_proj", "o_proj", "up_proj"]),
    "gemma3": (lambda: Gemma3TextConfig(**SHAPE, head_dim=64, sliding_window=40,
                                        layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                        pad_token_id=0),
               ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]),
    # the grouped expert kernels (Triton), a LoRA on every expert and the router
    "qwen3_moe": (lambda: Qwen3MoeConfig(**SHAPE, head_dim=64, moe_intermediate_size=128,
                                         num_experts=8, num_experts_per_tok=2,
                                         norm_topk_prob=True),
                  {"target_modules": ["q_proj", "o_proj"],
                   "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj",
                                         "mlp.gate.weight"]}),
}  # fmt: skip
BLOCK = 16


def family_rows(device: str, dry_run: bool):
    if dry_run:
        device = "cpu"  # the script's logic, on the CPU against itself
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family, (make, targets) in FAMILIES.items():
            base_dir, adapters = _world(Path(tmp) / family, make, targets)
            want = _logits(base_dir, adapters, "cpu", torch.float32, fp8=False)
            for dtype, fp8, bound in ((torch.float32, False, 1e-3), (torch.bfloat16, False, 0.05),
                                      (torch.bfloat16, True, 0.1)):  # fmt: skip
                got = _logits(base_dir, adapters, device, dtype, fp8=fp8)
                rel = float((got - want).norm() / want.norm())
                label = f"{family} {'fp8' if fp8 else str(dtype).removeprefix('torch.')}"
                rows.append((f"family {label}", "4 adapters + base, prompts past any window",
                             "relative logit error vs the CPU's fp32", f"{rel:.2e}",
                             f"<= {bound:g}", "yes" if rel <= bound else "no"))  # fmt: skip
    return rows


def _world(root: Path, make, targets) -> tuple[Path, dict]:
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(make()).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("mlp.gate.weight"):  # a router: scores far apart, no near ties
                p.copy_(torch.randn(p.shape))
    hf.save_pretrained(root / "base")
    spec = BaseModelSpec.from_dir(root / "base")
    adapters = {}
    for i in range(4):
        fields = targets if isinstance(targets, dict) else {"target_modules": targets}
        peft = get_peft_model(copy.deepcopy(hf), LoraConfig(r=8, lora_alpha=16, **fields))
        gen = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        peft.save_pretrained(root / f"a{i}")
        adapters[f"a{i}"] = load_adapter(root / f"a{i}", base=spec)
    return root / "base", adapters


def _logits(base_dir: Path, adapters: dict, device: str, dtype, *, fp8: bool) -> torch.Tensor:
    state = {k: v.to(device) for k, v in load_state_dict(base_dir).items()}
    model = LlamaModel(load_model_config(base_dir), state, fp8=fp8, dtype=dtype)
    slab = AdapterSlab(BaseModelSpec.from_dir(base_dir), num_slots=4, max_rank=8,
                       max_cpu_loras=0, loader=adapters.__getitem__, device=device,
                       dtype=dtype)  # fmt: skip
    slots = {name: slab.acquire(name) for name in adapters}
    names = ["a0", None, "a1", "a2", "a3", None]
    gen = torch.Generator().manual_seed(7)
    parts, next_block = [], 0
    for n, name in zip((70, 9, 120, 33, 64, 100), names):
        blocks = list(range(next_block, next_block + -(-n // BLOCK)))
        next_block = blocks[-1] + 1
        tokens = torch.randint(0, 1024, (n,), generator=gen).tolist()
        parts.append(StepSeq(tokens, 0, blocks, slots.get(name, -1), 1))
    kv = model.allocate_kv(num_blocks=128, block_size=BLOCK, device=device)
    step = build_step(parts, BLOCK)
    out = model.forward(plan_step(step, kv, slab)).float().cpu()  # [6, vocab]: each last token
    slab.close()
    return out
