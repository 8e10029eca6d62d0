"""Load a served model from a Hugging Face folder (or an fsspec URI): config, weights, tokenizer.

    quantization  auto: FP8 linears on CUDA sm_89+, the checkpoint dtype elsewhere
                  fp8:  FP8 linears anywhere (on a CPU an emulation: dequantize, then matmul)
                  none: the checkpoint dtype
    dtype         auto: the checkpoint dtype (bfloat16 on CUDA for a float32 checkpoint)

A checkpoint already in FP8 (`loraserve quantize`'s, or a published one: see
serving.model.fp8_formats) loads as stored and is never quantized again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from serving.model.checkpoint import load_state_dict, model_folder, resolve_model_path
from serving.model.errors import ModelLoadError
from serving.model.gemma_config import text_weights
from serving.model.hf_config import ModelConfig, load_model_config
from serving.model.llama import LlamaModel
from serving.model.tokenizer import Tokenizer

QUANTIZATIONS = ("auto", "fp8", "none")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    model: LlamaModel
    tokenizer: Tokenizer
    path: Path


def load_model(
    path: str | Path,
    *,
    quantization: str = "auto",
    dtype: str = "auto",
    device: str = "cpu",
    cache_dir: str | Path | None = None,
) -> LoadedModel:
    """The model at path (a folder or an fsspec URI copied once into cache_dir)."""
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(
            f"model.quantization: expected one of {QUANTIZATIONS}, got {quantization!r}"
        )
    folder = model_folder(path) if cache_dir is None else resolve_model_path(path, cache_dir)
    config = load_model_config(folder)
    prequantized = config.fp8 is not None  # FP8 as stored (serving.model.fp8_formats)
    if prequantized and quantization == "none":
        raise ModelLoadError(
            f"{folder}: the checkpoint is FP8; serve it with quantization fp8 or auto"
        )
    fp8 = quantize_on_load(quantization, prequantized, device)
    tokenizer = Tokenizer.from_dir(folder)
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(
            f"{folder}: the tokenizer makes token ids up to {tokenizer.vocab_size - 1}, "
            f"the model embeds only {config.vocab_size}"
        )
    state = load_state_dict(folder)
    if config.text_prefixes:  # a multimodal checkpoint: its vision tower stays on the disk
        state = text_weights(state, config.text_prefixes)
    if str(device) != "cpu":  # the weights (and FP8 quantization) live where the forward runs
        state = {name: t.to(device) for name, t in state.items()}
    model = LlamaModel(config, state, fp8=fp8, dtype=_dtype(dtype, config, device))
    return LoadedModel(config=config, model=model, tokenizer=tokenizer, path=folder)


def quantize_on_load(quantization: str, prequantized: bool, device: str) -> bool:
    """Whether linears stored in high precision are quantized to FP8 as they load. A
    pre-quantized checkpoint's FP8 linears stay FP8 either way; those it kept in high
    precision (its ignore list) stay so unless quantization is fp8."""
    if quantization == "fp8":
        return True
    return quantization == "auto" and not prequantized and _fp8_capable(device)


def _fp8_capable(device: str) -> bool:
    return str(device).startswith("cuda") and torch.cuda.get_device_capability(device) >= (8, 9)


def _dtype(name: str, config: ModelConfig, device: str) -> torch.dtype:
    if name != "auto":
        if name not in DTYPES:
            raise ModelLoadError(
                f"model.dtype: expected auto or one of {sorted(DTYPES)}, got {name!r}"
            )
        return DTYPES[name]
    if str(device).startswith("cuda") and config.torch_dtype == torch.float32:
        return torch.bfloat16
    return config.torch_dtype
