"""The CUDA model check of bench/gpu_all.py: an 8B-shaped decode step, FP8 against bf16."""

from __future__ import annotations

import torch

from bench.model import BLOCK, decode_step
from bench.model_shapes import config_for, random_state
from bench.timing import interleaved_seconds
from serving.model.llama import LlamaModel

CONTEXT = 512


def model_rows(device: str, dry_run: bool):
    """Decode-step time of an 8B-shaped model (random weights), FP8 over bf16, batch 1 to 32."""
    shape, batches = ("tiny", (1, 4)) if dry_run else ("llama-8b", (1, 4, 16, 32))
    dtype = torch.float32 if dry_run else torch.bfloat16
    config = config_for(shape)
    state = random_state(config, dtype, device)
    bf16 = LlamaModel(config, state, fp8=False, dtype=dtype)
    fp8 = LlamaModel(config, state, fp8=True, dtype=dtype)
    del state
    blocks = max(batches) * -(-CONTEXT // BLOCK)
    kv = {
        "bf16": bf16.allocate_kv(blocks, BLOCK, device),
        "fp8": fp8.allocate_kv(blocks, BLOCK, device),
    }
    rows = []
    for batch in batches:
        step = _to(decode_step(batch, CONTEXT, config.vocab_size), device)
        s = interleaved_seconds(
            {
                "bf16": lambda step=step: bf16.forward(step, kv["bf16"]),
                "fp8": lambda step=step: fp8.forward(step, kv["fp8"]),
            },
            rounds=3,
        )
        ratio = s["fp8"] / s["bf16"]
        rows.append(
            (
                "decode step fp8 / bf16",
                f"{shape}, batch {batch}, context {CONTEXT}",
                f"{s['fp8'] * 1e3:.2f} ms vs {s['bf16'] * 1e3:.2f} ms",
                f"{ratio:.2f}x",
                "<= 0.65x" if not dry_run else "(dry run)",
                ("yes" if ratio <= 0.65 else "no") if not dry_run else "-",
            )
        )
    return rows


def _to(step, device):
    fields = {
        k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(step).items()
    }
    return type(step)(**fields)
