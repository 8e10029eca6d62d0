"""The engine's own figures for bench/engine.py: step overhead and prefix-cache TTFT."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from bench.model import eager_forward
from bench.model_shapes import config_for, random_state
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.engine.runner import build_batch
from serving.engine.scheduler import Scheduled, SchedulerConfig
from serving.model.llama import LlamaModel


class _Tokenizer:
    """Enough tokenizer for token-id workloads: no EOS, empty text."""

    eos_token_ids = ()

    def decode_stream(self):
        return _Stream()


class _Stream:
    def step(self, token_id: int) -> str:
        return ""

    def finish(self) -> str:
        return ""


def overhead_rows(tmp: Path) -> list[str]:
    """Engine step (schedule + inputs + forward + sample) against a bare forward, 32 decodes."""
    config = config_for("medium")
    model = LlamaModel(config, random_state(config, torch.float32), fp8=False, dtype=torch.float32)
    engine = Engine(model, _Tokenizer(), EngineConfig(block_size=16, num_blocks=1024, max_model_len=512,
                    scheduler=SchedulerConfig(max_num_seqs=32)))  # fmt: skip
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    for i in range(32):
        engine.submit(
            GenerateRequest(f"o{i}", tuple(range(1 + i, 65 + i)), params), lambda out: None
        )
    for _ in range(6):  # the prompts in, decoding under way
        engine.step()
    running = engine.scheduler.running
    for seq in running:  # room for the next token, as the scheduler would make
        engine.blocks.append(seq, 1)
    inputs = build_batch([Scheduled(seq, 1) for seq in running], 16, lambda v: -1).inputs
    steps, bare = [], []
    for _ in range(10):  # interleaved, so both see the same machine
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            eager_forward(model, inputs, engine.kv)
        bare.append(time.perf_counter() - t0)
    step, fwd = sorted(steps)[5], sorted(bare)[5]
    params_m = sum(t.numel() for t in random_state(config, torch.float32).values()) / 1e6
    return [
        f"| engine overhead (medium model, {params_m:.0f}M params, 32 decodes) | ms |",
        "|---|---:|",
        f"| bare model forward | {fwd * 1e3:.1f} |",
        f"| engine step | {step * 1e3:.1f} |",
        f"| step / forward | {step / fwd:.2f}x (target <= 1.25x) |",
    ]


def ttft_rows(tmp: Path) -> list[str]:
    """Time to first token with a 2k-token shared prefix: cold, then a prefix-cache hit."""
    config = config_for("tiny-long")
    model = LlamaModel(config, random_state(config, torch.float32), fp8=False, dtype=torch.float32)
    engine = Engine(model, _Tokenizer(), EngineConfig(block_size=16, num_blocks=1024, max_model_len=4096,
                    scheduler=SchedulerConfig(max_num_batched_tokens=4096)))  # fmt: skip
    prefix = tuple(range(5, 2053))
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)

    def ttft(request_id: str, suffix: tuple[int, ...]) -> float:
        t0 = time.perf_counter()
        engine.submit(GenerateRequest(request_id, prefix + suffix, params), lambda out: None)
        engine.run_until_idle()
        return time.perf_counter() - t0

    other = tuple(range(3000, 5048))
    engine.submit(GenerateRequest("warm", other, params), lambda out: None)  # warm the kernels
    engine.run_until_idle()
    cold = ttft("cold", (2, 3))  # this prefix is new to the cache
    hit = ttft("hit", (4, 5))  # same prefix, other suffix: its full blocks hit
    return [
        "| TTFT, 2,048-token shared prefix (tiny model) | ms |",
        "|---|---:|",
        f"| cold | {cold * 1e3:.1f} |",
        f"| prefix-cache hit | {hit * 1e3:.1f} |",
        f"| hit / cold | {hit / cold:.2f}x (target <= 0.2x) |",
    ]
