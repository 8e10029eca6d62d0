"""PEFT's LoRA variants in the engine for bench/engine.py: a batch mixing every variant
against a plain-LoRA batch of the same shape, tokens/s side by side in one run (CPU).

Both batches deal their prompts round-robin over six adapters and a base-only row; in the
mixed batch four of the six are DoRA, lora_bias, rank_pattern + alpha_pattern and DoRA with
rsLoRA (PEFT-made, on the same tiny model), in the plain batch all six are plain rank-8 LoRA.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.engine_runs import loraserve_run, tok_s, workload
from bench.peers.tiny_world import build

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VARIANTS = {  # name: LoraConfig fields besides target_modules
    "dora": {"r": 8, "lora_alpha": 16, "use_dora": True},
    "lora_bias": {"r": 8, "lora_alpha": 16, "lora_bias": True},
    "patterns": {"r": 8, "lora_alpha": 16, "rank_pattern": {"q_proj": 4, "down_proj": 16},
                 "alpha_pattern": {"v_proj": 8}},
    "dora_rslora": {"r": 8, "lora_alpha": 16, "use_dora": True, "use_rslora": True},
}  # fmt: skip
# LoRA on the embedding and the LM head only: its rows against base rows (lora.embeddings)
OUTER = {"r": 8, "lora_alpha": 16, "target_modules": ["embed_tokens", "lm_head"]}
ROUNDS = 3  # plain and mixed alternate, so both see the same machine; medians reported


def save_variants(world: dict) -> None:
    """world["adapters"] gains VARIANTS, saved by PEFT on world's model (random A, B, m)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    for i, (name, fields) in enumerate({**VARIANTS, "outer": OUTER}.items()):
        path = Path(world["model"]).parent / f"variant-{name}"
        world["adapters"][name] = path
        if path.exists():
            continue
        base = LlamaForCausalLM.from_pretrained(world["model"])
        model = get_peft_model(base, LoraConfig(**{"target_modules": ALL, **fields}))
        gen = torch.Generator().manual_seed(2000 + i)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_magnitude_vector" in pname:  # m starts at ||W||: move it off
                    p.mul_(1 + 0.1 * torch.randn(p.shape, generator=gen))
                elif "lora_B" in pname:  # PEFT initialises B (and its bias) to zero
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        model.save_pretrained(path)


def variant_rows(tmp: Path, num_prompts: int = 32) -> list[str]:
    """The mixed-variant batch against the plain batch: tok/s of each and their ratio."""
    world = build(tmp / "variants", num_adapters=6, rank=8)
    save_variants(world)
    plain = [f"adapter{i}" for i in range(6)] + [None]
    mixed = [*VARIANTS, "adapter0", "adapter1", None]
    runs: dict[str, list[float]] = {"plain": [], "mixed": []}
    for _ in range(ROUNDS):
        for label, names in (("plain", plain), ("mixed", mixed)):
            runs[label].append(tok_s(loraserve_run(world, workload(num_prompts, names), 6)))
    p, m = statistics.median(runs["plain"]), statistics.median(runs["mixed"])
    outer: dict[str, list[float]] = {"base": [], "outer": []}
    for _ in range(ROUNDS):  # every row base-only, then every row with embedding + head LoRA
        for label, names in (("base", [None]), ("outer", ["outer"])):
            run = loraserve_run(world, workload(num_prompts, names), 6, embeddings=True)
            outer[label].append(tok_s(run))
    b, o = statistics.median(outer["base"]), statistics.median(outer["outer"])
    return [
        f"| LoRA variants (tiny model, {num_prompts} prompts, 6 adapters + base rows) "
        "| tok/s | vs plain |",
        "|---|---:|---:|",
        f"| plain LoRA, 6 adapters | {p:.0f} | 1.00x |",
        f"| DoRA, lora_bias, patterns, DoRA+rsLoRA + 2 plain | {m:.0f} | {m / p:.2f}x "
        "(target >= 0.8x) |",
        "",
        f"| embedding + LM-head LoRA rows (tiny model, {num_prompts} prompts) | tok/s | vs base |",
        "|---|---:|---:|",
        f"| base rows, lora.embeddings on | {b:.0f} | 1.00x |",
        f"| every row: LoRA on embed_tokens and lm_head | {o:.0f} | {o / b:.2f}x |",
    ]
