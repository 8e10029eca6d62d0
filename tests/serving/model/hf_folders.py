"""Tiny Hugging Face model folders for tests, written by transformers itself.

Models: tiny Llama / Mistral / Qwen2 configs and weights via save_pretrained. Tokenizers:
trained in-process with `tokenizers` (no hub), wrapped as transformers' fast tokenizer and
saved with a chat template, in three families: byte-level BPE (GPT-2, Llama 3, Qwen2),
sentencepiece-style BPE with byte fallback (Llama 2, Mistral) and Unigram with Metaspace.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
)
FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}

SAMPLES = [
    "Hello, world! This is a test.",
    "Café crème brûlée, naïve façade — déjà vu.",
    "日本語のテキストと中文文本。",
    "emoji 😀🎉👍🏽 and 🇫🇷 flags",
    "line one\nline two\n\n\ttabbed  double  spaces ",
    "def f(x):\n    return {'a': [x ** 2, x // 3]}  # ok\n",
    "  leading spaces and trailing   ",
    "<s>special</s> tokens in text <|user|>",
]
SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]


def save_tiny_model(
    folder: Path, family: str = "llama", shard: str | None = None, dtype=None, **overrides
):
    """Save a randomly initialized tiny model (weights in dtype); returns the model."""
    config_cls, model_cls = FAMILIES[family]
    config = config_cls(**{**TINY, **overrides})
    torch.manual_seed(0)
    model = model_cls(config)
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kwargs)
    return model


def write_config(folder: Path, raw: dict, generation: dict | None = None) -> Path:
    """Write config.json (and generation_config.json) as given: for hand-made layouts."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def save_generation_config(folder: Path, eos_token_id) -> None:
    GenerationConfig(eos_token_id=eos_token_id).save_pretrained(folder)


def _corpus() -> list[str]:
    return SAMPLES * 20 + ["the quick brown fox jumps over the lazy dog"] * 20


def byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def byte_fallback_bpe() -> Tokenizer:
    """Llama 2 / Mistral's layout: '▁' for spaces, <0xNN> tokens for bytes out of vocabulary."""
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    # train on ASCII only, so accents, CJK and emoji go through the byte tokens
    tok.train_from_iterator([s for s in _corpus() if s.isascii()], trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    data["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(data))
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def unigram_metaspace() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=SPECIALS, unk_token="<unk>")
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 2)]
    )
    return tok


TOKENIZERS = {"byte_level_bpe": byte_level_bpe, "byte_fallback_bpe": byte_fallback_bpe,
              "unigram_metaspace": unigram_metaspace}  # fmt: skip


def save_tokenizer(folder: Path, kind: str, chat_template: str | None = None, **config) -> Path:
    """Wrap a trained tokenizer as transformers' fast tokenizer and save_pretrained it."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=TOKENIZERS[kind](),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        **config,
    )
    if chat_template is not None:
        hf.chat_template = chat_template
    hf.save_pretrained(folder)
    return folder
