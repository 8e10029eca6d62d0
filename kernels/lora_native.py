"""A step's LoRA on the CPU as one compiled call per projection (kernels/lora_cpu.c).

A decode step with many adapters makes a handful of small torch calls per projection
(a gather, two `bmm`s per slice, a concatenation, a scatter-add), and on a CPU each call's
fixed cost is most of the LoRA's time; a prefill of short prompts, several per adapter,
pays for thin grouped matmuls. The C kernel does the whole projection in one call, reading
each adapter's rows once. Steps whose tokens come in long runs of one adapter keep torch's
matmuls per run, which reuse each adapter's rows across the run's tokens.

The kernel is compiled with the system's C compiler on first use (as Triton builds its
launchers), cached in a private directory and checked before it is loaded with ctypes
(kernels/native_build.py); where there is no compiler, or LORASERVE_CPU_NATIVE=0,
`available()` is False and the torch path runs instead. The kernel follows the indices it
is given into raw memory, so they are checked first (`_check_indices`).
"""

from __future__ import annotations

import ctypes
import threading

import torch

from kernels import native_build

_SLICE_FIELDS = 8  # lora_cpu.c: A_PTR, A_SLOT, A_ROW, B_PTR, B_SLOT, B_ROW, OUT, COL
_lock = threading.Lock()
_kernel: ctypes._CFuncPtr | None = None
_tried = False
_described: dict[tuple[int, int], tuple] = {}  # see _stacks
_MAX_DESCRIBED = 4096  # a model's layers times its projections, with room to spare


def available() -> bool:
    """Whether the compiled kernel can run here (compiled and loaded on the first call)."""
    global _kernel, _tried
    if _tried:
        return _kernel is not None
    with _lock:
        if not _tried:
            _kernel = _load()
            _tried = True
    return _kernel is not None


def lora_apply_rows(x, lora_a, lora_b, y, order, slots, ranks, scales, checked=None) -> bool:
    """y[t, slice s] += scales[slot t] * (x[t] @ A_s[slot t, :r].T) @ B_s[slot t, :r], r = rank t.

    x: [T, in]; lora_a[s]: [num_slots, max_rank, in]; lora_b[s]: [num_slots, max_rank, out_s];
    y: [T, sum(out_s)]; order: [n] int64 active tokens sorted by (rank, slot); slots,
    ranks: [n] int32 of each sorted token; scales: [num_slots] float32. Returns False, having
    done nothing, where the operands don't fit the kernel (float32 on the CPU, rows of
    stride 1): the caller runs the torch path. ValueError where an index is out of the
    operands' bounds (see _check_indices), before the kernel sees any. checked: the plan's
    kernel_indices (kernels/cpu_plan.py), whose bounds stand for these tensors when they are
    its own. Call `available()` first.
    """
    described = _stacks(lora_a, lora_b)
    if described is None or not (_fits(x) and _fits(y) and _fits(scales)):
        return False
    stacks, in_dim, out_dim, num_slots, max_rank = described
    shapes_fit = (
        x.dim() == y.dim() == 2 and x.shape == (y.shape[0], in_dim) and y.shape[1] == out_dim
        and scales.numel() == num_slots
    )  # fmt: skip
    indices = ((order, torch.int64), (slots, torch.int32), (ranks, torch.int32))
    if not shapes_fit or not all(t.dtype == d and t.is_contiguous() for t, d in indices):
        return False  # the torch path then names what does not fit
    _check_indices(order, slots, ranks, x.shape[0], num_slots, max_rank, checked)
    _kernel(
        order.numel(), order.data_ptr(), slots.data_ptr(), ranks.data_ptr(), scales.data_ptr(),
        x.data_ptr(), x.stride(0), in_dim, y.data_ptr(), y.stride(0), len(lora_a), stacks,
        torch.get_num_threads(),
    )  # fmt: skip
    return True


def _check_indices(
    order, slots, ranks, num_tokens: int, num_slots: int, max_rank: int, checked=None
) -> None:
    """ValueError unless order, slots and ranks have one entry per active token each, and
    order is in [0, num_tokens), slots in [0, num_slots), ranks in [0, max_rank].

    The kernel reads and writes where these point, so one out of bounds would corrupt
    memory or crash the process; as a ValueError it fails the step, which the engine
    attributes as it does any fault of a forward (serving/engine/faults.py). Base-only
    tokens (slot -1) are never among the kernel's: they were dropped from the order. The
    bounds are the plan's, reduced where it was built from the host lists these tensors were
    made from (so a forward reads nothing back), when these are the plan's own tensors
    (never written after: a frozen CpuPlan); any others are reduced here.
    """
    if len({order.numel(), slots.numel(), ranks.numel()}) != 1:
        raise ValueError(
            f"order, slots, ranks: expected one entry per active token each, got "
            f"{order.numel()}, {slots.numel()} and {ranks.numel()}"
        )
    if order.numel() == 0:
        return  # a step of base-only tokens: the kernel follows no index
    if checked is not None and all(a is b for a, b in zip(checked[:3], (order, slots, ranks))):
        bounds = checked[3]
    else:  # one reduction per tensor: [min, max] of each
        bounds = [int(v) for t in (order, slots, ranks) for v in torch.aminmax(t)]
    limits = (("order", "row", num_tokens), ("slots", "slot", num_slots),
              ("ranks", "rank", max_rank + 1))  # fmt: skip
    for (name, what, end), lo, hi in zip(limits, bounds[::2], bounds[1::2]):
        if lo < 0 or hi >= end:
            raise ValueError(
                f"{name}: {what} {lo if lo < 0 else hi} is out of range; expected 0..{end - 1}"
            )


def _fits(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1


def _stacks(lora_a, lora_b) -> tuple[ctypes.Array, int, int, int, int] | None:
    """(the slices' description for the kernel, _SLICE_FIELDS each; in; sum(out_s);
    num_slots; max_rank), or None where the stacks don't fit it or each other. Kept per pair
    of tuples: a model passes the same ones every step (the slab's tensors never move), and
    the entry holds them, so their ids are not reused meanwhile.

    Slots are described by their strides, so the slab's paged stacks, whose slots overlap
    (slot s's rows from s * stride(0), stride(0) == page_rank * width), need nothing else:
    a view's own bounds hold max_rank rows from every slot, so the indices _check_indices
    admits (slots below num_slots, ranks up to max_rank) stay inside its storage."""
    entry = _described.get((id(lora_a), id(lora_b)))
    if entry is not None and entry[0] is lora_a and entry[1] is lora_b:
        return entry[2]
    described = None
    a0 = lora_a[0] if lora_a else None
    if (
        a0 is not None and len(lora_a) == len(lora_b)
        and all(_fits(t) and t.dim() == 3 for t in (*lora_a, *lora_b))
        and all(t.shape[:2] == a0.shape[:2] for t in (*lora_a, *lora_b))
        and all(a.shape[2] == a0.shape[2] for a in lora_a)
    ):  # fmt: skip
        meta, col = [], 0
        for a, b in zip(lora_a, lora_b):
            meta += [a.data_ptr(), a.stride(0), a.stride(1), b.data_ptr(), b.stride(0)]
            meta += [b.stride(1), b.shape[2], col]
            col += b.shape[2]
        meta = (ctypes.c_int64 * len(meta))(*meta)
        described = (meta, a0.shape[2], col, a0.shape[0], a0.shape[1])
    if len(_described) >= _MAX_DESCRIBED:
        _described.clear()
    _described[id(lora_a), id(lora_b)] = (lora_a, lora_b, described)
    return described


def _load() -> ctypes._CFuncPtr | None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    argtypes = [i64, ptr, ptr, ptr, ptr, ptr, i64, i64, ptr, i64, i64, ptr, ctypes.c_int32]
    return native_build.load("lora_apply_rows", argtypes, what="the compiled CPU LoRA kernel")
