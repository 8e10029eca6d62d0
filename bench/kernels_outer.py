"""The cost of LoRA on the embedding and the LM head at decode shapes, for bench/kernels.py (CPU).

Vocabulary 32000, hidden 2048, a decode batch whose every token uses one of 8 rank-16
adapters; timed interleaved, in one run, against the base rows the same step computes anyway:
  embed       the base embedding gather, E[ids]
  embed+lora  the gather, then serving.model.adapter_embeddings.embedding_lora (a column gather of A, expand)
  head        the base LM head, out @ W.T
  head+lora   lora_linear over the head: the same matmul, then shrink + expand into vocab
"""

from __future__ import annotations

import torch

from adapters.format.tensor_names import OUTER_LAYER
from bench.timing import interleaved_seconds
from kernels import build_segments
from serving.model.adapter_embeddings import embedding_lora
from serving.model.linear import Linear, LoraStacks, StepLora, lora_linear

VOCAB, HIDDEN, RANK, NUM_SLOTS = 32000, 2048, 16, 8


class _Slab:
    """The two slab stacks embedding_lora reads, as AdapterSlab lays them out."""

    def __init__(self, a, b):
        self.a, self.b, self.max_rank = a, b, RANK

    def lora_a(self, layer, module):
        return self.a

    def lora_b(self, layer, module):
        return self.b


def run_case(num_tokens: int, dtype: torch.dtype) -> dict[str, float]:
    gen = torch.Generator().manual_seed(num_tokens)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    embed, head = rand(VOCAB, HIDDEN, scale=0.02), rand(VOCAB, HIDDEN, scale=HIDDEN**-0.5)
    # The embedding's A is [slots, r, vocab] and its B [slots, r, hidden]; the head's the reverse.
    slab = _Slab(rand(NUM_SLOTS, RANK, VOCAB), rand(NUM_SLOTS, RANK, HIDDEN, scale=0.1))
    stacks = LoraStacks((rand(NUM_SLOTS, RANK, HIDDEN, scale=HIDDEN**-0.5),),
                        (rand(NUM_SLOTS, RANK, VOCAB, scale=0.1),))  # fmt: skip
    slots = (torch.arange(num_tokens) % NUM_SLOTS).to(torch.int32)
    segments = build_segments(slots, torch.full((NUM_SLOTS,), RANK, dtype=torch.int32))
    lora = StepLora(segments, torch.full((NUM_SLOTS,), 2.0), RANK)
    ids = torch.randint(0, VOCAB, (num_tokens,), generator=gen)
    out = rand(num_tokens, HIDDEN)
    base_head = Linear(head, None, None)
    assert OUTER_LAYER < 0  # the slab's key for the outer stacks; _Slab ignores it

    def embed_lora():
        h = embed[ids]
        embedding_lora(h, ids, slab, lora)

    return interleaved_seconds(
        {
            "embed": lambda: embed[ids],
            "embed_lora": embed_lora,
            "head": lambda: out @ head.T,
            "head_lora": lambda: lora_linear(out, base_head, stacks, lora),
        }
    )


def outer_rows(dtype: torch.dtype, quick: bool) -> list[str]:
    """The markdown table: embedding and LM-head LoRA rows against their base rows."""
    lines = [
        "| tokens | embed ms | embed+LoRA ms | embed ratio | head ms | head+LoRA ms "
        "| head ratio | (embed+head) LoRA / base |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for num_tokens in (16,) if quick else (16, 256):
        s = run_case(num_tokens, dtype)
        both = (s["embed_lora"] + s["head_lora"]) / (s["embed"] + s["head"])
        lines.append(
            f"| {num_tokens} | {s['embed'] * 1e3:.3f} | {s['embed_lora'] * 1e3:.3f} "
            f"| {s['embed_lora'] / s['embed']:.1f}x | {s['head'] * 1e3:.3f} "
            f"| {s['head_lora'] * 1e3:.3f} | {s['head_lora'] / s['head']:.2f}x | {both:.2f}x |"
        )
    return lines
