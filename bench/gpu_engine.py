"""The CUDA serving check of bench/gpu_all.py: the engine serves the demo kit on the GPU.

The demo kit's base with its three adapters and n-gram speculation, fp32 weights, TF32 off:
greedy tokens on CUDA against the same engine on the CPU (placement of weights, KV cache,
slab and step inputs; the Triton LoRA and attention kernels inside a real engine).
"""

from __future__ import annotations

from pathlib import Path

import torch

from adapters.format.adapter import load_adapter
from adapters.format.base_model import BaseModelSpec
from adapters.slab.slab import AdapterSlab
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.speculative.config import SpecConfig
from serving.model.loader import load_model

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
PROMPTS = ["def read_lines(path):\n", "class Stack:\n", "import os\n\n", "def merge(a, b):\n"]


def engine_rows(device: str, dry_run: bool):
    if dry_run:
        device = "cpu"  # the script's logic, on the CPU against itself
    torch.backends.cuda.matmul.allow_tf32 = False
    want = _greedy("cpu")
    got = _greedy(device)
    same = sum(a == b for a, b in zip(want, got))
    return [("engine on " + device, "demo kit, 3 adapters + base, n-gram spec, fp32",
             f"{same}/{len(want)} requests equal the CPU's greedy tokens", f"{same / len(want):.2f}",
             "all equal", "yes" if same == len(want) else "no")]  # fmt: skip


def _greedy(device: str) -> list[list[int]]:
    loaded = load_model(DEMO / "base", quantization="none", dtype="float32", device=device)
    spec = BaseModelSpec.from_dir(DEMO / "base")
    adapters = {}
    for name in ("upper", "comment", "rot13"):
        adapter = load_adapter(DEMO / "adapters" / name, base=spec)
        adapters[f"{name}@{adapter.digest}"] = adapter
    slab = AdapterSlab(spec, num_slots=4, max_rank=16, max_cpu_loras=0,
                       loader=adapters.__getitem__, device=device)  # fmt: skip
    config = EngineConfig(num_blocks=256, speculative=SpecConfig(method="ngram", adaptive=False))
    engine = Engine(loaded.model, loaded.tokenizer, config, slab=slab)
    versions = [None, *adapters]
    outputs: dict[str, list[int]] = {}
    params = SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=1.2)
    for i, (prompt, version) in enumerate((p, v) for p in PROMPTS for v in versions):
        ids = tuple(loaded.tokenizer.encode(prompt))
        engine.submit(GenerateRequest(f"r{i}", ids, params, version),
                      lambda out: outputs.setdefault(out.request_id, []).extend(out.new_token_ids))  # fmt: skip
    engine.run_until_idle()
    return [outputs[f"r{i}"] for i in range(len(outputs))]
