"""The decoder on CPU: time per token in fp32 against the FP8 emulation, and weight memory.

    python -m bench.model [--shape cpu-1b-ish]

Decode: 8 sequences at context 128, one new token each. Prefill: one 256-token prompt.
The FP8 emulation on a CPU dequantizes each linear before its matmul (a CPU has no FP8
arithmetic), so it shows the cost of the emulation, not a speed-up; the memory column is
what FP8 saves on any device.
"""

from __future__ import annotations

import argparse

import torch

from bench.model_shapes import SHAPES, config_for, random_state, weight_bytes
from bench.timing import interleaved_seconds, machine
from serving.model.llama import LlamaModel
from serving.model.step_plan import StepInputs, StepSeq, build_step, plan_step

BLOCK = 16


def eager_forward(model: LlamaModel, step: StepInputs, kv, slab=None) -> torch.Tensor:
    """One forward of step as the engine runs it eagerly: planned (plan_step), then run."""
    return model.forward(plan_step(step, kv, slab))


def planned_decode(batch: int, context: int, vocab: int, slots: list[int]) -> StepInputs:
    """A decode step at position context - 1 of each of batch sequences, own blocks each, as
    the engine builds it (host lists included, so decode graphs can run it); sequence i uses
    adapter slot slots[i % len(slots)] (-1: base only)."""
    per_seq = -(-context // BLOCK)
    gen = torch.Generator().manual_seed(batch)
    return build_step([
        StepSeq([int(torch.randint(0, vocab, (1,), generator=gen))], context - 1,
                list(range(i * per_seq, (i + 1) * per_seq)), slots[i % len(slots)])
        for i in range(batch)
    ], BLOCK)  # fmt: skip


def decode_step(batch: int, context: int, vocab: int) -> StepInputs:
    blocks = -(-context // BLOCK)
    tables = torch.arange(batch * blocks, dtype=torch.int32).view(batch, blocks)
    positions = torch.full((batch,), context - 1)
    return StepInputs(
        token_ids=torch.randint(0, vocab, (batch,)),
        positions=positions,
        slot_mapping=tables[:, -1].long() * BLOCK + (context - 1) % BLOCK,
        block_tables=tables,
        context_lens=torch.full((batch,), context, dtype=torch.int32),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
        logits_indices=torch.arange(batch),
    )


def prefill_step(length: int, vocab: int) -> StepInputs:
    blocks = -(-length // BLOCK)
    return StepInputs(
        token_ids=torch.randint(0, vocab, (length,)),
        positions=torch.arange(length),
        slot_mapping=torch.arange(length),
        block_tables=torch.arange(blocks, dtype=torch.int32).view(1, blocks),
        context_lens=torch.tensor([length], dtype=torch.int32),
        query_start_loc=torch.tensor([0, length], dtype=torch.int32),
        logits_indices=torch.tensor([length - 1]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="cpu-1b-ish", choices=sorted(SHAPES))
    args = parser.parse_args()
    torch.manual_seed(0)
    config = config_for(args.shape, "float32")
    state = random_state(config, torch.float32)
    models = {
        "fp32": LlamaModel(config, state, fp8=False, dtype=torch.float32),
        "fp8 emulation": LlamaModel(config, state, fp8=True, dtype=torch.float32),
        "bf16": LlamaModel(config, state, fp8=False, dtype=torch.bfloat16),
        "fp8 + bf16": LlamaModel(config, state, fp8=True, dtype=torch.bfloat16),
    }
    decode = decode_step(8, 128, config.vocab_size)
    prefill = prefill_step(256, config.vocab_size)
    kv = {name: models[name].allocate_kv(64, BLOCK) for name in ("fp32", "fp8 emulation")}
    fns = {}
    for name in ("fp32", "fp8 emulation"):
        fns[f"{name} decode"] = lambda n=name: eager_forward(models[n], decode, kv[n])
        fns[f"{name} prefill"] = lambda n=name: eager_forward(models[n], prefill, kv[n])
    s = interleaved_seconds(fns, rounds=3)

    params = sum(t.numel() for t in state.values())
    print(f"machine: {machine()}; model {args.shape}: {params / 1e6:.0f}M parameters\n")
    print("| step | fp32 ms/token | fp8 emulation ms/token | fp8 / fp32 |")
    print("|---|---:|---:|---:|")
    for step, tokens in (("decode, 8 seqs at context 128", 8), ("prefill, 256 tokens", 256)):
        key = step.split(",")[0]
        a, b = s[f"fp32 {key}"] / tokens, s[f"fp8 emulation {key}"] / tokens
        print(f"| {step} | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.2f}x |")
    lin8, all8 = weight_bytes(models["fp8 + bf16"])
    lin16, all16 = weight_bytes(models["bf16"])
    print("\n| weights | bf16 MB | fp8 MB | fp8 / bf16 |")
    print("|---|---:|---:|---:|")
    print(
        f"| decoder linears (+ scales) | {lin16 / 1e6:.1f} | {lin8 / 1e6:.1f} | {lin8 / lin16:.2f}x |"
    )
    print(
        f"| whole model (embeddings, norms, LM head stay bf16) | {all16 / 1e6:.1f} | {all8 / 1e6:.1f} | {all8 / all16:.2f}x |"
    )


if __name__ == "__main__":
    main()
