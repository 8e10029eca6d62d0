"""The one builder of a step: its model inputs from the scheduler's Python lists, then its plan.

    seqs [A: 5 new tokens from position 0, B: 1 new token at position 9 (a decode)]
    token_ids      A0 A1 A2 A3 A4 B9
    positions       0  1  2  3  4  9
    slot_mapping   block_table[pos // block_size] * block_size + pos % block_size
    query_start    [0, 5, 6];  context_lens [5, 10]
    logits rows    the last `logits` rows of each sequence

build_step makes those tensors (StepInputs); plan_step checks them against the KV cache, moves
them where the cache is, and derives once what every layer shares: the attention metadata
with the step's KV writes, and the LoRA segments of the layers and of the LM head (StepPlan).
LlamaModel.forward only reads a plan. The engine's step, the draft model's rounds, the eager
decode graphs and the tests all build their steps here. The lists the tensors are made from
go with them (StepInputs.host), so a step is checked and planned without reading anything
back from the device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kernels import AttentionPlan, HostIndex, checked_plan, upload
from serving.model.linear import StepLora
from serving.model.step_lora import step_lora

if TYPE_CHECKING:
    from adapters.slab.reads import SlabReads


@dataclass(frozen=True)
class StepSeq:
    """One sequence's share of a step: its new tokens, from position `start` on."""

    tokens: Sequence[int]
    start: int  # the first new token's position (the tokens before it have KV already)
    block_table: Sequence[int]
    adapter_slot: int = -1  # its adapter's slab slot; -1: base only
    logits: int = 1  # how many of its last rows want logits (0: none, a prefill chunk)


@dataclass(frozen=True)
class StepInputs:
    """One forward step: the new tokens of every scheduled sequence, concatenated."""

    token_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, each token's position in its sequence
    slot_mapping: torch.Tensor  # [T] int64, KV cache slot (block * block_size + offset)
    block_tables: torch.Tensor  # [S, max_blocks] int32
    context_lens: torch.Tensor  # [S] int32, cached + new tokens per sequence
    query_start_loc: torch.Tensor  # [S + 1] int32, cumulative new-token counts
    logits_indices: torch.Tensor  # [K] int64, the rows whose logits are wanted
    adapter_slots: torch.Tensor | None = None  # [T] int32 slab slot per token, -1 = base only
    host: HostIndex | None = None  # the index tensors' Python lists (build_step's)

    def to(self, device: torch.device) -> StepInputs:
        """The same step with every tensor on device (built on the CPU, run where the weights are)."""
        if self.token_ids.device == device:
            return self
        moved = {k: upload(v, device) if isinstance(v, torch.Tensor) else v
                 for k, v in vars(self).items()}  # fmt: skip
        return StepInputs(**moved)


@dataclass(frozen=True)
class StepPlan:
    """What one forward reads besides the weights: the step's inputs, checked and on the
    cache's device, the caches and slab it runs on, and what every layer shares."""

    inputs: StepInputs
    kv_caches: list  # per layer (k_cache, v_cache), each [num_blocks, block_size, Hkv, D]
    slab: SlabReads | None  # the adapter slab; None: every row base only
    attention: AttentionPlan  # the batch's attention metadata and its KV writes
    lora: StepLora | None = None  # the tokens' segments; None: no slab or no adapter slots
    head_lora: StepLora | None = None  # the logits rows' alone, when the slab serves lm_head
    checks: bool = False  # LORASERVE_CHECKS=1: every layer checks its arguments as well


def build_step(seqs: Sequence[StepSeq], block_size: int, *, adapters: bool = True) -> StepInputs:
    """The model inputs of seqs, in order; adapters=False: no adapter_slots (no slab)."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    slot_ids: list[int] = []
    qsl, lens, rows = [0], [], []
    width = max(len(s.block_table) for s in seqs)
    tables = []
    for s in seqs:
        n, table = len(s.tokens), s.block_table
        ids += s.tokens
        positions = range(s.start, s.start + n)
        pos += positions
        slots += [table[p // block_size] * block_size + p % block_size for p in positions]
        slot_ids += [s.adapter_slot] * n
        qsl.append(qsl[-1] + n)
        lens.append(s.start + n)
        rows += range(qsl[-1] - s.logits, qsl[-1])
        tables.append((*table, *[0] * (width - len(table))))
    host_slots = tuple(slot_ids) if adapters else None
    host = HostIndex(tuple(qsl), tuple(lens), tuple(slots), tuple(tables), host_slots, tuple(rows))
    return StepInputs(
        token_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        logits_indices=torch.tensor(rows, dtype=torch.int64),
        adapter_slots=torch.tensor(slot_ids, dtype=torch.int32) if adapters else None,
        host=host,
    )


def window_reach(*models) -> int | None:
    """The widest attention window of every layer of models, or None when some layer (or a
    model that names no windows) reads the whole context."""
    windows = [w for m in models for w in getattr(m, "windows", None) or (None,)]
    return None if not windows or None in windows else max(windows)


def plan_step(
    inputs: StepInputs, kv_caches, slab: SlabReads | None = None, window: int | None = None
) -> StepPlan:
    """The plan of running inputs on kv_caches (per layer (k_cache, v_cache)) and slab.

    The batch is checked once here, not in every layer (each check reads index tensors back
    from the device, unless the step carries its host lists); ValueError names what is wrong.
    window: the model's window_reach; table entries below it may then be -1 (released blocks).
    """
    k_cache = kv_caches[0][0]  # every layer's cache has its shape
    step = inputs.to(k_cache.device)
    checks = os.environ.get("LORASERVE_CHECKS") == "1"
    lora = head = None
    if slab is not None and step.adapter_slots is not None:
        host = step.host.adapter_slots if step.host is not None else None
        lora = step_lora(step.adapter_slots, slab, host, checks)
    attention = checked_plan(k_cache, step.block_tables, step.context_lens,
                             step.query_start_loc, step.slot_mapping, step.host, window)  # fmt: skip
    if lora is not None and slab.serves_outer("lm_head"):
        head = _head_lora(step, slab, checks)
    return StepPlan(step, kv_caches, slab, attention, lora, head, checks)


def _head_lora(step: StepInputs, slab: SlabReads, checked: bool) -> StepLora:
    """The LoRA segments of the logits rows alone, which are all the LM head sees."""
    slots = step.adapter_slots.index_select(0, step.logits_indices)  # [K]
    host = step.host
    listed = host is not None and None not in (host.adapter_slots, host.logits_rows)
    host_slots = [host.adapter_slots[r] for r in host.logits_rows] if listed else None
    return step_lora(slots, slab, host_slots, checked)
