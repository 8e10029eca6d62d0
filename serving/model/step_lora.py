"""What every LoRA layer of one step shares, and each projection's slab stacks.

    step_lora(slots)      the tokens' segments by adapter slot, the slab's scales, and the
                          rows whose adapters carry lora_B biases or DoRA
    layer_stacks(layer)   a projection's A and B stacks (a slice per fused module), its
                          biases and DoRA scales when the step needs them, its module ranks

Given the step's host lists, both are built without reading anything back from the device.
"""

from __future__ import annotations

import weakref
from functools import partial

import torch

from kernels import build_segments, upload
from serving.model.linear import LoraStacks, RowSet, StepLora

_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # slab -> {key: LoraStacks}


def step_lora(slots: torch.Tensor, slab, host=None, checked=False) -> StepLora:
    """The segments of tokens in `slots` ([n], -1 = base only) and the rows needing extras;
    host: slots as a list (grouped on the host then, with the slab's host ranks and flags)."""
    vectors = slab.vectors
    ranks = (host, slab.host_ranks) if host is not None else None
    rows = partial(_rows, slots, host)
    return StepLora(
        segments=build_segments(slots, slab.ranks, ranks), scales=slab.scales,
        max_rank=slab.max_rank,
        bias_rows=rows(vectors.has_bias, vectors.host_bias) if vectors.num_bias else None,
        dora_rows=rows(vectors.has_dora, vectors.host_dora) if vectors.num_dora else None,
        host_scales=slab.host_scales, checked=checked,
    )  # fmt: skip


def _rows(slots: torch.Tensor, host, flags: torch.Tensor, host_flags) -> RowSet | None:
    """The tokens whose slot is flagged; None when there is none (with no host lists, one
    device sync per step)."""
    if host is not None:
        picked = [t for t, s in enumerate(host) if s >= 0 and host_flags[s]]
        if not picked:
            return None
        as_long = lambda values: upload(torch.tensor(values, dtype=torch.int64), slots.device)  # noqa: E731
        return RowSet(rows=as_long(picked), slots=as_long([host[t] for t in picked]))
    used = flags.index_select(0, slots.clamp(min=0).to(torch.int64)) & (slots >= 0)
    rows = used.nonzero().squeeze(1)
    if rows.numel() == 0:
        return None
    return RowSet(rows=rows, slots=slots.index_select(0, rows).to(torch.int64))


def layer_stacks(slab, layer: int, modules, lora: StepLora | None) -> LoraStacks | None:
    """The stacks of (layer, modules) in slab, made once: the slab's tensors never move, its
    module ranks are views of tables updated in place, and its host ranks are lists
    updated in place, so one LoraStacks serves every step."""
    if lora is None:
        return None
    key = (layer, tuple(modules), lora.bias_rows is not None, lora.dora_rows is not None)
    made = _made.setdefault(slab, {})
    stacks = made.get(key)
    if stacks is None:
        stacks = _stacks(slab, layer, modules, lora)
        if stacks.ranks is None or stacks.ranks._base is not None:  # a copy would go stale
            made[key] = stacks
    return stacks


def _stacks(slab, layer: int, modules, lora: StepLora) -> LoraStacks:
    return LoraStacks(
        a=tuple(slab.lora_a(layer, m) for m in modules),
        b=tuple(slab.lora_b(layer, m) for m in modules),
        bias=tuple(slab.lora_bias(layer, m) for m in modules) if lora.bias_rows else (),
        dora=tuple(slab.lora_dora(layer, m) for m in modules) if lora.dora_rows else (),
        ranks=slab.module_ranks(layer, modules),
        host_ranks=slab.module_host_ranks(layer, modules),
    )
