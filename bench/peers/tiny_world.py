"""A tiny Llama model + tokenizer + PEFT LoRA adapters on disk, for peer benchmarks/tests.

Run with the main venv (needs torch, transformers, peft, tokenizers):
    python -m bench.peers.tiny_world OUT_DIR
"""

from __future__ import annotations

import json
from pathlib import Path


def _build_tokenizer(out: Path, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "low",
        "rank",
        "adapters",
        "serve",
        "many",
        "tenants",
        "from",
        "one",
        "base",
        "model",
        "and",
        "the",
        "kernels",
        "gather",
        "weights",
        "per",
        "token",
    ]
    corpus = [
        " ".join(words[(i * 7) % len(words) :] + words[: (i * 7) % len(words)]) + f" {i}"
        for i in range(2000)
    ]
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    fast.save_pretrained(out)
    return fast


def build(
    root: Path,
    hidden: int = 256,
    layers: int = 4,
    vocab: int = 4096,
    num_adapters: int = 2,
    rank: int = 8,
    seed: int = 0,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    family: str = "llama",
) -> dict:
    """Write ``root/model`` (fp32, tokenizer.json; a Llama, or family "qwen3", "phi3",
    "gemma2", "gemma3" or "qwen3_moe") and
    ``root/adapter{i}`` (PEFT LoRA on every linear, as the family's model names them).

    Returns {"model": Path, "adapters": {name: Path}, "config": {...}}. Reuses an existing
    world when ``root/world.json`` matches the arguments. head_dim = hidden // heads must be
    >= 32 for vLLM's CPU build.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        Phi3Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    root = Path(root).absolute()
    intermediate = intermediate or (hidden * 43 // 16)  # 256 -> 688
    cfg = dict(
        hidden=hidden,
        layers=layers,
        vocab=vocab,
        num_adapters=num_adapters,
        rank=rank,
        seed=seed,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        family=family,
    )
    model_dir = root / "model"
    adapters = {f"adapter{i}": root / f"adapter{i}" for i in range(num_adapters)}
    meta = root / "world.json"
    result = {"model": model_dir, "adapters": adapters, "config": cfg}
    if meta.exists() and json.loads(meta.read_text()).get("config") == cfg:
        return result
    if hidden // heads < 32:
        raise ValueError(f"head_dim {hidden // heads} < 32 is refused by vLLM's CPU build")

    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tok = _build_tokenizer(model_dir, vocab)
    config_class = {"llama": LlamaConfig, "qwen3": Qwen3Config, "phi3": Phi3Config,
                    "gemma2": Gemma2Config, "gemma3": Gemma3TextConfig,
                    "qwen3_moe": Qwen3MoeConfig}[family]  # fmt: skip
    # Qwen3-MoE: 8 experts of a quarter of the dense width, 2 per token
    sparse = {"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
              "moe_intermediate_size": intermediate // 4} if family == "qwen3_moe" else {}  # fmt: skip
    config = config_class(
        **sparse,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):  # a router: scores far apart, no near ties
                p.copy_(torch.randn(p.shape))
    model.save_pretrained(model_dir, safe_serialization=True)

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    params = None
    if family == "phi3":  # its fused linears
        targets = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    if family == "qwen3_moe":  # attention's linears, and every expert's stacked parameters
        targets, params = targets[:4], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    for i, (_name, path) in enumerate(adapters.items()):
        base = AutoModelForCausalLM.from_pretrained(model_dir)
        lcfg = LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            target_modules=targets,
            target_parameters=params,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        peft_model = get_peft_model(base, lcfg)
        g = torch.Generator().manual_seed(seed + 1000 + i)
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if "lora_B" in pname:  # PEFT initialises B to zero; make the adapter matter
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        peft_model.save_pretrained(path)
    meta.write_text(
        json.dumps(
            {
                "config": cfg,
                "model": str(model_dir),
                "adapters": {k: str(v) for k, v in adapters.items()},
            },
            indent=1,
        )
    )
    return result


if __name__ == "__main__":
    import sys

    r = build(Path(sys.argv[1] if len(sys.argv) > 1 else ".bench-venvs/tiny-world"))
    print(
        json.dumps(
            {"model": str(r["model"]), "adapters": {k: str(v) for k, v in r["adapters"].items()}}
        )
    )
