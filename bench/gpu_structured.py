"""The structured-output check of bench/gpu_all.py: constrained decoding on the GPU.

The demo kit's base (FP8 where the device has it) serves a batch of 32 under the RECORD
schema (bench/structured_workload.py) and free, alternated (bench.structured.decode_row): the
masks are filled on the host and applied to logits on the device (xgrammar's CUDA kernel).
Rows: constrained tokens/s against the matched free run (target >= 0.9x at batch 32), and
every constrained output validating against its schema (jsonschema).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema

from bench.structured import TimedModel, decode_row, serve
from bench.structured_workload import RECORD, prompts, response_format
from serving.engine.engine import Engine, EngineConfig
from serving.engine.scheduler import SchedulerConfig
from serving.model.loader import load_model

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
# Room for any RECORD to close: its strings hold at most 50 + 30 + 50 + 3 x 20 characters and
# its syntax about 70, and its tokens are rarely shorter than a character. (224 cut four short
# on an H200, where FP8 weights send the demo model down longer paths.)
CLOSE_TOKENS = 320


def structured_rows(device: str, dry_run: bool):
    batch, rounds = (2, 1) if dry_run else (32, 3)
    quantization, dtype = ("none", "float32") if dry_run else ("auto", "auto")
    loaded = load_model(DEMO / "base", quantization=quantization, dtype=dtype, device=device)
    config = EngineConfig(max_model_len=2048, num_blocks=2048, block_size=16,
                          scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096))  # fmt: skip
    engine = Engine(TimedModel(loaded.model), loaded.tokenizer, config)
    try:
        fmt, ps = response_format(RECORD), prompts(loaded.tokenizer)
        rows = [ps[i % len(ps)] for i in range(batch)]
        out = serve(engine, rows, fmt, [CLOSE_TOKENS] * batch)[
            "outputs"
        ]  # warm-up, and the outputs
        faults = [_fault(loaded.tokenizer.decode(tokens), len(tokens)) for tokens in out]
        valid = faults.count(None)
        for fault in filter(None, faults):  # to the log: what an invalid output was
            print(f"structured output invalid: {fault}", file=sys.stderr)
        r = decode_row(engine, rows, fmt, rounds)
    finally:
        engine.shutdown()
    ratio = r["constrained"] / r["matched"]
    shape = f"demo kit ({quantization}), batch {batch}, RECORD"
    return [
        ("structured decode", shape,
         f"{r['constrained']:.0f} vs {r['matched']:.0f} tok/s; masks {1e3 * r['masks']:.3f} ms/step",
         f"{ratio:.2f}x", ">= 0.9x", "yes" if ratio >= 0.9 else "no"),
        ("structured output", shape, f"{valid}/{batch} outputs validate", f"{valid / batch:.2f}",
         "all valid", "yes" if valid == batch else "no"),
    ]  # fmt: skip


def _fault(text: str, num_tokens: int) -> str | None:
    """Why text is not a RECORD (None: it is one)."""
    try:
        jsonschema.validate(json.loads(text), RECORD)
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]!r}; {num_tokens} tokens: {text[-300:]!r}"
    return None
