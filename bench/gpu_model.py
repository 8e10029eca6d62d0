"""The CUDA model check of bench/gpu_all.py: an 8B-shaped decode step, FP8 against bf16,
run eagerly and replayed from CUDA graphs (as the engine runs decode steps on a GPU)."""

from __future__ import annotations

from functools import partial

import torch

from bench.model import BLOCK, decode_step, eager_forward, planned_decode
from bench.model_shapes import config_for, random_state
from bench.timing import interleaved_seconds
from serving.model.decode_graphs import DecodeGraphs
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
    models = {"bf16": bf16, "fp8": fp8}
    kv = {name: m.allocate_kv(blocks + 1, BLOCK, device) for name, m in models.items()}
    graphs = {
        name: DecodeGraphs(m, kv[name], None, scratch_block=blocks, block_size=BLOCK,
                           max_context=CONTEXT, max_batch=max(batches), capture=not dry_run)
        for name, m in models.items()
    }  # fmt: skip
    rows = []
    for batch in batches:
        step = _to(decode_step(batch, CONTEXT, config.vocab_size), device)
        planned = planned_decode(batch, CONTEXT, config.vocab_size, [-1])
        s = interleaved_seconds({
            **{name: partial(eager_forward, m, step, kv[name]) for name, m in models.items()},
            **{f"{name} graphs": partial(g.forward, planned) for name, g in graphs.items()},
        }, rounds=3)  # fmt: skip
        for how, suffix in (("eager", ""), ("graphs", " graphs")):
            fp8_s, bf16_s = s["fp8" + suffix], s["bf16" + suffix]
            ratio = fp8_s / bf16_s
            rows.append((
                f"decode step fp8 / bf16 ({how})", f"{shape}, batch {batch}, context {CONTEXT}",
                f"{fp8_s * 1e3:.2f} ms vs {bf16_s * 1e3:.2f} ms", f"{ratio:.2f}x",
                "<= 0.65x" if not dry_run else "(dry run)",
                ("yes" if ratio <= 0.65 else "no") if not dry_run else "-",
            ))  # fmt: skip
    return rows


def _to(step, device):
    fields = {
        k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(step).items()
    }
    return type(step)(**fields)
