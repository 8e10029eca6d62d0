"""The CUDA speculative-decoding check of bench/gpu_all.py: what verification and drafting cost.

An 8B-shaped target (FP8) with a 1B-shaped draft (bf16), random weights, context 512:
  verify / decode   a step scoring k + 1 = 5 rows per sequence against a plain decode step
  draft cost c      one draft decode step against one target decode step
With acceptance a, the speed-up is (1 - a^5) / (1 - a) / (4 c + verify cost): these two
figures are what the engine's adaptive k and its max_batch_size rest on.
"""

from __future__ import annotations

from functools import partial

import torch

from bench.gpu_model import _to
from bench.model import BLOCK, decode_step, eager_forward
from bench.model_shapes import config_for, random_state
from bench.timing import interleaved_seconds
from serving.model.llama import LlamaModel
from serving.model.step_plan import StepInputs

CONTEXT, K = 512, 4


def verify_step(batch: int, context: int, k: int, vocab: int) -> StepInputs:
    """k + 1 new rows per sequence at the end of a context of `context` tokens."""
    blocks = -(-(context + k) // BLOCK)
    tables = torch.arange(batch * blocks, dtype=torch.int32).view(batch, blocks)
    pos = torch.arange(context - 1, context + k).repeat(batch)  # [batch * (k + 1)]
    rows = torch.arange(batch).repeat_interleave(k + 1)
    return StepInputs(
        token_ids=torch.randint(0, vocab, (batch * (k + 1),)),
        positions=pos,
        slot_mapping=tables[rows, pos // BLOCK].long() * BLOCK + pos % BLOCK,
        block_tables=tables,
        context_lens=torch.full((batch,), context + k, dtype=torch.int32),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32) * (k + 1),
        logits_indices=torch.arange(batch * (k + 1)),
    )


def spec_rows(device: str, dry_run: bool):
    target_shape, draft_shape = ("tiny", "tiny-draft") if dry_run else ("llama-8b", "llama-1b")
    batches = (1, 4) if dry_run else (1, 8, 32)
    dtype = torch.float32 if dry_run else torch.bfloat16
    tc, dc = config_for(target_shape), config_for(draft_shape)
    state = random_state(tc, dtype, device)
    target = LlamaModel(tc, state, fp8=not dry_run, dtype=dtype)
    del state
    draft = LlamaModel(dc, random_state(dc, dtype, device), fp8=False, dtype=dtype)
    blocks = max(batches) * -(-(CONTEXT + K) // BLOCK)
    kv_t, kv_d = target.allocate_kv(blocks, BLOCK, device), draft.allocate_kv(blocks, BLOCK, device)
    rows = []
    for batch in batches:
        dec = _to(decode_step(batch, CONTEXT, tc.vocab_size), device)
        ver = _to(verify_step(batch, CONTEXT, K, tc.vocab_size), device)
        s = interleaved_seconds(
            {
                "decode": partial(eager_forward, target, dec, kv_t),
                "verify": partial(eager_forward, target, ver, kv_t),
                "draft": partial(eager_forward, draft, dec, kv_d),
            },
            rounds=3,
        )
        where = f"{target_shape} + {draft_shape}, batch {batch}, context {CONTEXT}"
        ratio = s["verify"] / s["decode"]
        rows.append(("spec verify k+1=5 / decode", where,
                     f"{s['verify'] * 1e3:.2f} ms vs {s['decode'] * 1e3:.2f} ms", f"{ratio:.2f}x",
                     "(measured)", "-"))  # fmt: skip
        c = s["draft"] / s["decode"]
        rows.append(("spec draft cost c", where, f"{s['draft'] * 1e3:.2f} ms per draft step",
                     f"{c:.2f}", "(measured)", "-"))  # fmt: skip
    return rows
