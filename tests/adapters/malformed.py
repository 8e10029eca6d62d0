"""Malformed adapters, each with the message that refuses it: the table the format, CLI and
pattern tests share. Each case builds its files from PEFT-shaped defaults with one fault."""

import json
import struct

import torch
from safetensors.torch import save

from tests.adapters.factory import peft_adapter_files, peft_config, peft_tensors

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def with_config(**changes):
    files = peft_adapter_files()
    config = json.loads(files[CONFIG])
    config.update(changes)
    return {**files, CONFIG: json.dumps(config).encode()}


def with_tensors(tensors, **config):
    return {CONFIG: json.dumps(peft_config(**config)).encode(), WEIGHTS: save(tensors)}


def _renamed(old, new, **config):
    t = peft_tensors()
    return with_tensors({k.replace(old, new): v for k, v in t.items()}, **config)


def _poisoned(value):
    t = peft_tensors()
    next(iter(t.values()))[0, 0] = value
    return with_tensors(t)


def _lying_header():
    data = bytearray(peft_adapter_files()[WEIGHTS])
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    first = next(k for k in header if k != "__metadata__")
    header[first]["data_offsets"][1] += 10**12  # claims a terabyte
    blob = json.dumps(header).encode()
    return {
        CONFIG: peft_adapter_files()[CONFIG],
        WEIGHTS: struct.pack("<Q", len(blob)) + blob + data[8 + n :],
    }


def _short_header():
    data = peft_adapter_files()[WEIGHTS]
    return {CONFIG: peft_adapter_files()[CONFIG], WEIGHTS: struct.pack("<Q", 10**9) + data[8:]}


MALFORMED = [
    (
        "missing config",
        lambda: {WEIGHTS: peft_adapter_files()[WEIGHTS]},
        "adapter_config.json is missing",
    ),
    (
        "missing weights",
        lambda: {CONFIG: peft_adapter_files()[CONFIG]},
        "adapter_model.safetensors is missing",
    ),
    (
        "pickle weights",
        lambda: {CONFIG: peft_adapter_files()[CONFIG], "adapter_model.bin": b"\x80\x04"},
        "is pickle and is refused; save with",
    ),
    ("config not json", lambda: {**peft_adapter_files(), CONFIG: b"{nope"}, "is not valid JSON"),
    ("not lora", lambda: with_config(peft_type="IA3"), "peft_type IA3 is not supported"),
    (
        "dora without magnitudes",
        lambda: with_config(use_dora=True),
        "layer 0 q_proj: use_dora is set but lora_magnitude_vector is missing",
    ),
    (
        "modules_to_save",
        lambda: with_config(modules_to_save=["lm_head"]),
        "modules_to_save is not supported: merge those modules into the base model, or train",
    ),
    ("bias", lambda: with_config(bias="lora_only"), "bias 'lora_only' is not supported"),
    (
        "layer patterns",
        lambda: with_config(layers_pattern="layers"),
        r"layer patterns \(layers_pattern\)",
    ),
    (
        "rank pattern misfit",
        lambda: with_config(rank_pattern={"q_proj": 4}),
        r"layer 0 q_proj: lora_A \(8, \d+\) and lora_B \(\d+, 8\) do not fit rank 4 \(rank_pattern",
    ),
    (
        "alpha past float's range",
        lambda: with_config(lora_alpha=10**400),
        "lora_alpha must be a number, got 1000",
    ),
    (
        "alpha pattern past float's range",
        lambda: with_config(alpha_pattern={"q_proj": 10**400}),
        r"alpha_pattern\['q_proj'\] must be a number",
    ),
    (
        "rank pattern not a regex",
        lambda: with_config(rank_pattern={"q_proj(": 4}),
        r"rank_pattern: pattern 'q_proj\(' is not a valid regex",
    ),
    (
        "lora_bias without biases",
        lambda: with_config(lora_bias=True),
        "lora_bias is set but lora_B.bias is missing",
    ),
    ("rank too high", lambda: with_config(r=128), "rank 128 is above lora.max_lora_rank"),
    ("bad rank", lambda: with_config(r=0), "r must be a positive integer"),
    (
        "module the base lacks",
        lambda: _renamed("q_proj", "c_attn", modules=("c_attn", "v_proj")),
        "the base model has no module 'c_attn'",
    ),
    (
        "name matches no module",
        lambda: _renamed("lora_A.weight", "lora_down.weight"),
        "matches no LoRA module",
    ),
    (
        "shape misfit",
        lambda: with_tensors(
            peft_tensors(modules=("q_proj",))
            | {
                "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight": torch.zeros(
                    8, 65
                ),
                "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight": torch.zeros(
                    32, 8
                ),
            }
        ),
        "do not fit the base model's v_proj",
    ),
    ("rank misfit", lambda: with_tensors(peft_tensors(rank=4)), "do not fit rank 8"),
    (
        "layer out of range",
        lambda: _renamed("layers.1.", "layers.7."),
        "layer 7 is out of range; the base model has 2",
    ),
    (
        "unpaired",
        lambda: with_tensors(
            {k: v for k, v in peft_tensors().items() if "layers.0.self_attn.q_proj.lora_B" not in k}
        ),
        "has lora_A without its pair",
    ),
    ("nan", lambda: _poisoned(float("nan")), "contains NaN or Inf"),
    ("inf", lambda: _poisoned(float("inf")), "contains NaN or Inf"),
    (
        "dtype",
        lambda: with_tensors({k: v.double() for k, v in peft_tensors().items()}),
        "unsupported dtype F64",
    ),
    ("lying header", _lying_header, "header that lies about its offsets"),
    ("short file", _short_header, "safetensors header claims"),
    ("empty weights", lambda: with_tensors({}), "holds no tensors"),
]
