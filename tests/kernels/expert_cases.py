"""The mixture-of-experts problems for tests/kernels/test_expert_linear.py, and their oracle.

The LoRA stacks are laid out as the adapter slab's expert stacks: [E, rows, width] storage
viewed [E, num_pages, max_rank, width], slot p starting page_rank rows after slot p - 1, so
slots overlap. Every row no adapter holds is NaN, and so is the scale of every page that is
not a slot: a backend that reads past a slot's rank, or another slot's or expert's rows, has
NaN or another adapter's numbers in its result. The oracle is a plain loop over the unsorted
rows in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.fp8 import quantize_fp8

# Slots are first pages; an adapter holds ceil(rank / page_rank) pages from its slot.
#   page   0   1-2   3   4-5   6
#   rank   3   8     -   5     2
NUM_PAGES, PAGE_RANK, MAX_RANK = 7, 4, 8
SLOT_RANKS = [3, 8, 0, 0, 5, 0, 2]
USED_SLOTS = [-1, 0, 1, 4, 6]
NUM_EXPERTS, IN = 3, 24


@dataclass(frozen=True)
class Problem:
    x: torch.Tensor  # [N, in], rows unsorted
    expert_ids: list[int]
    slots: list[int]
    weight: torch.Tensor  # [E, out, in], x's dtype or FP8
    w_scale: torch.Tensor | None
    w_ref: torch.Tensor  # [E, out, in] float64: the weight the oracle multiplies by
    lora_a: tuple[torch.Tensor, ...] | None
    lora_b: tuple[torch.Tensor, ...] | None
    scales: torch.Tensor | None


def paged_stacks(width: int, fan_in: int, gen, dtype, num_experts=NUM_EXPERTS) -> torch.Tensor:
    """[E, num_pages, max_rank, width] overlapping views of [E, rows, width]: each slot's rows
    :rank random, every other row NaN."""
    rows = (NUM_PAGES - 1) * PAGE_RANK + MAX_RANK
    stored = torch.full((num_experts, rows, width), torch.nan)
    for slot, rank in enumerate(SLOT_RANKS):
        first = slot * PAGE_RANK
        stored[:, first : first + rank] = torch.randn(num_experts, rank, width, generator=gen)
    stored = (stored / fan_in**0.5).to(dtype)
    size = (num_experts, NUM_PAGES, MAX_RANK, width)
    return stored.as_strided(size, (rows * width, PAGE_RANK * width, width, 1))


def problem(num_rows=37, widths=(20, 12), dtype=torch.float32, *, seed=0, fp8=False,
            lora=True, skewed=False) -> Problem:  # fmt: skip
    """Random rows, experts and slots (skewed: most rows in one (expert, slot), a group that
    spans several tiles); gate|up for two widths."""
    gen = torch.Generator().manual_seed(seed)
    expert_ids = torch.randint(0, NUM_EXPERTS, (num_rows,), generator=gen).tolist()
    picks = torch.randint(0, len(USED_SLOTS), (num_rows,), generator=gen).tolist()
    slots = [USED_SLOTS[i] for i in picks]
    for n in range(num_rows if skewed else 0):
        if n % 4 != 3:
            expert_ids[n], slots[n] = 0, 1
    x = torch.randn(num_rows, IN, generator=gen).to(dtype)
    out = sum(widths)
    w = torch.randn(NUM_EXPERTS, out, IN, generator=gen) / IN**0.5
    if fp8:
        quantized = [quantize_fp8(w[e]) for e in range(NUM_EXPERTS)]
        weight = torch.stack([q for q, _ in quantized])
        w_scale = torch.stack([s for _, s in quantized])
        w_ref = weight.double() * w_scale.double()[:, :, None]
    else:
        weight, w_scale = w.to(dtype), None
        w_ref = weight.double()
    lora_a = lora_b = scales = None
    if lora:
        lora_a = tuple(paged_stacks(IN, IN, gen, dtype) for _ in widths)
        lora_b = tuple(paged_stacks(wd, MAX_RANK, gen, dtype) for wd in widths)
        scales = torch.full((NUM_PAGES,), torch.nan)
        held = [s for s, r in enumerate(SLOT_RANKS) if r]
        scales[held] = torch.rand(len(held), generator=gen) * 2 + 0.25
    return Problem(x, expert_ids, slots, weight, w_scale, w_ref, lora_a, lora_b, scales)


def oracle(p: Problem) -> torch.Tensor:
    """y[n] = W[e] x[n] + scale[s] * B_i[e, s, :r].T A_i[e, s, :r] x[n] per slice, float64."""
    y = torch.zeros(p.x.shape[0], p.w_ref.shape[1], dtype=torch.float64)
    for n, (e, s) in enumerate(zip(p.expert_ids, p.slots)):
        xn = p.x[n].double()
        y[n] = p.w_ref[e] @ xn
        if p.lora_a is None or s < 0:
            continue
        r, col = SLOT_RANKS[s], 0
        for a, b in zip(p.lora_a, p.lora_b):
            t = a[e, s, :r].double() @ xn  # [r]
            width = b.shape[3]
            y[n, col : col + width] += p.scales[s].double() * (t @ b[e, s, :r].double())
            col += width
    return y


def moved(t: torch.Tensor | None, device) -> torch.Tensor | None:
    """t on device with its strides: the whole storage moved and viewed again, so the
    paged stacks' slots still overlap there (Tensor.to would make them contiguous)."""
    if t is None or t.device == torch.device(device):
        return t
    flat = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
    return flat.to(device).as_strided(t.shape, t.stride(), t.storage_offset())
