"""A step's attention on the CPU as one compiled call per layer (kernels/attention_cpu.c).

The torch path copies every decoding sequence's context out of the paged cache into a
padded batch, zeroes the padding and runs one masked SDPA, and each prefill chunk's on its
own: on a decode step of a small model those copies and the mask cost more than the
attention's arithmetic, and more than all of the step's linears. The C kernel reads each key
and value where the cache holds it, with the softmax kept online, for up to 32 queries of a
sequence at a time, and reads nothing past a query's position.

Built with the LoRA kernel into one library (kernels/native_build.py); where there is no
compiler, or LORASERVE_CPU_NATIVE=0, `available()` is False and the torch path runs. The
kernel follows the step's block table and spans into raw memory, so `attend` takes
them only from an attention plan, whose table is clamped into the cache, and checks that
the operands are the ones the plan describes.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from kernels import native_build


def available() -> bool:
    """Whether the compiled kernel can run here (compiled and loaded on the first call)."""
    return _load() is not None


@functools.cache  # a second caller racing the first builds again, and renames atomically
def _load() -> ctypes._CFuncPtr | None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    argtypes = [i64, ptr, ptr, i64, ptr, i64, i64, ptr, ptr, i64, i64, i64, i64, ctypes.c_float,
                i64, ctypes.c_float, ptr, i64, i64, ctypes.c_int32]  # fmt: skip
    return native_build.load("paged_attention_cpu", argtypes, ctypes.c_int32,
                             "the compiled CPU attention kernel")  # fmt: skip


def attend(q, k_cache, v_cache, out, spans, table, num_tokens: int, num_blocks: int,
           block_size: int, scale: float, window: int | None = None,
           softcap: float | None = None) -> bool:  # fmt: skip
    """out[first + i, h] = softmax(q[first + i, h] . K_s[w..p] * scale) V_s[w..p] for each
    sequence s of spans, p = ctx - n + i its query i's position, K_s its blocks in table, and
    w = max(0, p - window + 1) with a sliding window (else 0); with a softcap, each score s
    is softcap * tanh(s / softcap) before the softmax.

    q, out: [T, H, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; spans: [S, 3]
    int64 (first query row, n, ctx); table: [S, >= ceil(max ctx / block_size)] int64 block ids
    in [0, num_blocks), as plan_attention clamps them; num_tokens: the plan's T; block_size:
    the plan's, which the table's width is counted in. Returns False, having done nothing,
    where the operands don't fit the kernel (float32 on the CPU, last dimension contiguous):
    the caller runs the torch path. Call `available()` first.
    """
    if not all(_fits(t) for t in (q, k_cache, v_cache, out)):
        return False
    if not (spans.dtype == table.dtype == torch.int64 and spans.is_contiguous()
            and table.stride(-1) == 1
            and spans.device.type == table.device.type == "cpu"):  # fmt: skip
        return False
    _, _, num_kv_heads, head_dim = k_cache.shape
    # The plan's bounds stand for these operands only if they are the ones it was made for.
    if (
        q.shape != out.shape or q.shape[0] != num_tokens or v_cache.shape != k_cache.shape
        or not k_cache.is_contiguous() or not v_cache.is_contiguous()
        or k_cache.shape[0] < num_blocks or k_cache.shape[1] != block_size
        or q.shape[2] != head_dim or q.shape[1] % num_kv_heads
    ):  # fmt: skip
        raise ValueError(
            f"attention operands do not match the step's plan: q {tuple(q.shape)}, cache "
            f"{tuple(k_cache.shape)} (the plan's table names {num_blocks} blocks)"
        )
    failed = _load()(
        spans.shape[0], spans.data_ptr(), table.data_ptr(), table.stride(0), q.data_ptr(),
        q.stride(0), q.stride(1), k_cache.data_ptr(), v_cache.data_ptr(), block_size,
        num_kv_heads, head_dim, q.shape[1], scale, window or 0, softcap or 0.0, out.data_ptr(),
        out.stride(0),
        out.stride(1), torch.get_num_threads(),
    )  # fmt: skip
    if failed:
        raise MemoryError("the CPU attention kernel could not allocate its accumulators")
    return True


def _fits(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1
