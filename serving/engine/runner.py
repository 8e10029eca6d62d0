"""From a schedule to the model's StepInputs, and back to one set of logits per finished prefill.

scheduled [A: 5 new tokens from 0, B: 1 new token at 9 (decode)]
token_ids      A0 A1 A2 A3 A4 B9
positions       0  1  2  3  4  9
slot_mapping   block_table[pos // block_size] * block_size + pos % block_size
query_start    [0, 5, 6];  context_lens [5, 10]
logits rows    [4, 5]  (A's prompt is complete; a chunk that is not yet complete gets none)

A decoding sequence with proposals d1..dk also feeds them, at the positions after its last
token, and gets k + 1 logits rows: the target scores every proposal in this one forward.

A sequence that wants its prompt's logits (prompt_logprobs) gets a row for every position of
its chunk: the row at position p scores prompt token p + 1, and on the last chunk the last
row is its sampled one. With A asking, above: rows [0, 1, 2, 3, 4, 5], A's prompt rows
0..3 score A1..A4, and 4 and 5 are sampled. Every other sequence's rows are as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels import cpu_lora_kernel_ready
from serving.engine.scheduler import Scheduled
from serving.engine.sequence import Sequence
from serving.model.decode_graphs import DecodeGraphs
from serving.model.step_plan import StepInputs, StepSeq, build_step, plan_step, window_reach


@dataclass(frozen=True)
class PromptRows:
    """A sequence's logits rows that score its own prompt tokens: rows row..row + count - 1
    score the tokens at positions start + 1 .. start + count."""

    seq: Sequence
    row: int
    start: int
    count: int


@dataclass(frozen=True)
class Batch:
    inputs: StepInputs
    sampled: list[Scheduled]  # the sequences that get a token this step, in logits-row order
    first_rows: list[int]  # per sampled sequence, its first row in the logits (k + 1 rows each)
    prompt_rows: list[PromptRows] = field(default_factory=list)  # of the prompt_logprobs rows


def build_batch(
    scheduled: list[Scheduled],
    block_size: int,
    slot_of,
    proposals: dict[int, list[int]] | None = None,
) -> Batch:
    """slot_of(version) -> the adapter's slab slot (the version is resident and pinned).

    proposals: seq_id -> proposed tokens, for decoding sequences whose blocks have room.
    """
    proposals = proposals or {}
    seqs, sampled, first_rows, prompt_rows, num_rows = [], [], [], [], 0
    for item in scheduled:
        seq, start = item.seq, item.seq.num_cached_tokens
        drafts = proposals.get(seq.seq_id, [])
        complete = start + item.num_new_tokens == seq.num_tokens  # all in: sample the next
        # the chunk's positions whose next token is a prompt token (none once delivered)
        scored = 0
        if seq.wants_prompt_logits:
            scored = max(0, min(start + item.num_new_tokens, seq.num_prompt_tokens - 1) - start)
        logits = scored + (len(drafts) + 1 if complete else 0)
        seqs.append(StepSeq(
            seq.token_ids[start : start + item.num_new_tokens] + drafts, start,
            seq.block_table, slot_of(seq.request.adapter) if seq.request.adapter else -1, logits,
        ))  # fmt: skip
        if scored:
            prompt_rows.append(PromptRows(seq, num_rows, start, scored))
        if complete:
            first_rows.append(num_rows + scored)
            sampled.append(item)
        num_rows += logits
    return Batch(build_step(seqs, block_size), sampled, first_rows, prompt_rows)


class Forward:
    """The engine's forward: decode steps by CUDA graph replay where the graphs cover them
    (on a GPU, with cuda_graphs), every other step eagerly, planned first (plan_step)."""

    def __init__(self, model, num_blocks: int, block_size: int, slab, *, cuda_graphs: bool,
                 max_context: int, max_batch: int) -> None:  # fmt: skip
        embed = getattr(model, "embed", None)
        # A sparse MLP reads its routing back to the host every layer: no graph captures it.
        graphable = getattr(model, "graphable", True)
        on_gpu = cuda_graphs and graphable and isinstance(embed, torch.Tensor) and embed.is_cuda
        # The graphs' padding rows write their keys to one spare block past the managed ones.
        self.kv = model.allocate_kv(num_blocks + int(on_gpu), block_size)
        self.model, self.slab, self.graphs = model, slab, None
        self.window = window_reach(model)  # table entries below it may be released (-1)
        if on_gpu:
            self.graphs = DecodeGraphs(model, self.kv, slab, scratch_block=num_blocks,
                                       block_size=block_size, max_context=max_context,
                                       max_batch=max_batch)  # fmt: skip
        elif slab is not None and isinstance(embed, torch.Tensor) and embed.device.type == "cpu":
            cpu_lora_kernel_ready()  # built now (once a machine), not inside a first request

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        if self.graphs is not None and self.graphs.covers(inputs):
            return self.graphs.forward(inputs)
        return self.model.forward(plan_step(inputs, self.kv, self.slab, self.window))
