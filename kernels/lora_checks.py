"""Argument checks shared by every LoRA op backend: a bad call is a ValueError that names the argument."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.segments import Segments

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def as_slices(name: str, stacks: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """A single [num_slots, ...] stack or a sequence of them (one per fused output slice)."""
    if isinstance(stacks, torch.Tensor):
        return (stacks,)
    if isinstance(stacks, Sequence) and stacks and all(isinstance(s, torch.Tensor) for s in stacks):
        return tuple(stacks)
    raise ValueError(f"{name}: expected a tensor or a non-empty sequence of tensors")


def check_tensor(name: str, t, *, dim: int, dtypes=None, device=None) -> None:
    """t is a tensor of `dim` dimensions, of one of `dtypes`, on `device` (each when given)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name}: expected dtype in ({names}), got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got {t.device}")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    """t.shape == expected."""
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}")


def check_stacks(name: str, stacks: tuple[torch.Tensor, ...], *, dtype, device) -> None:
    """Each slice is a [num_slots, max_rank, dim] stack sharing num_slots and max_rank, its
    rows dense (stride(2) == 1, stride(1) == dim) and its slots a whole number of rows
    apart, the same number in every slice.

    Slots may overlap: a paged slab's slot s starts page_rank rows after slot s - 1 and
    reaches max_rank rows (stride(0) == page_rank * dim); a contiguous stack is the case
    page_rank == max_rank. The kernels read rows [:rank] of each slot they are sent.
    """
    first, slot_rows = stacks[0], None
    for i, s in enumerate(stacks):
        label = name if len(stacks) == 1 else f"{name}[{i}]"
        check_tensor(label, s, dim=3, dtypes=(dtype,), device=device)
        slot_rows = _slot_rows(s) if i == 0 else slot_rows
        if s.shape[:2] != first.shape[:2]:
            raise ValueError(
                f"{label}: expected [num_slots, max_rank] = {tuple(first.shape[:2])} like slice 0, "
                f"got {tuple(s.shape[:2])}"
            )
        if s.stride(2) != 1 or s.stride(1) != s.shape[2]:
            raise ValueError(
                f"{label}: expected dense rows (strides (*, {s.shape[2]}, 1)), got strides "
                f"{tuple(s.stride())}"
            )
        if _slot_rows(s) is None or _slot_rows(s) != slot_rows:
            like = "" if slot_rows is None else f", {slot_rows} like slice 0"
            raise ValueError(
                f"{label}: expected slots a whole number of rows apart (stride(0) a multiple "
                f"of stride(1){like}), got strides {tuple(s.stride())}"
            )


def _slot_rows(stack: torch.Tensor) -> int | None:
    """How many rows apart a stack's slots start (None: not a whole number, or not >= 1)."""
    rows, rest = divmod(stack.stride(0), max(stack.stride(1), 1))
    return rows if rest == 0 and rows >= 1 else None


def check_segments(segments, *, num_tokens: int, num_slots: int, max_rank: int, device) -> None:
    """segments were built for this many tokens and slots, on this device, within max_rank."""
    if not isinstance(segments, Segments):
        raise ValueError(
            f"segments: expected Segments from build_segments, got {type(segments).__name__}"
        )
    if segments.num_tokens != num_tokens:
        raise ValueError(
            f"segments: built for {segments.num_tokens} tokens, but the input has {num_tokens}"
        )
    if segments.num_slots != num_slots:
        raise ValueError(
            f"segments: built for {segments.num_slots} slots, but the adapter stack has {num_slots}"
        )
    if segments.token_order.device != device:
        raise ValueError(
            f"segments: expected tensors on {device}, got {segments.token_order.device}"
        )
    if segments.max_rank > max_rank:
        raise ValueError(
            f"segments: a slot has rank {segments.max_rank}, above the stack's max_rank {max_rank}"
        )
